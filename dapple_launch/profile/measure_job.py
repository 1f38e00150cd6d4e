"""A measured profile taken in a process of its own: `python -m dapple_launch.profile.measure_job
MODEL_YAML BATCH DEVICE PRECISION OUT_JSON`.

Timing layers on a GPU initialises CUDA in the process that does it. The launching command must
not be that process: it goes on to start the ranks (launch/zygote.py forks them, and a forked
child cannot use a CUDA context its parent made), and a CUDA context holds memory on the card for
as long as the command runs. So the planner asks this job for the profile and reads the JSON it
writes (the measured-profile cache keeps it for the next plan). Only the standard library and the
model's config cross over: the model is built again here from its config, as every rank builds it.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path


def measure_elsewhere(model_cfg, batch_size: int, device: str, precision: str):
    """The measured profile of the model `model_cfg` describes, taken by this module run as its own
    process on `device`; a ValueError with the job's last line if it fails."""
    from omegaconf import OmegaConf

    from .model_profile import ModelProfile

    with tempfile.TemporaryDirectory(prefix="dapple-measure-") as tmp:
        model_yaml, out = Path(tmp) / "model.yaml", Path(tmp) / "profile.json"
        model_yaml.write_text(OmegaConf.to_yaml(model_cfg, resolve=True))
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "dapple_launch.profile.measure_job",
                str(model_yaml),
                str(batch_size),
                device,
                precision,
                str(out),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or not out.is_file():
            lines = (done.stderr or done.stdout or "").strip().splitlines()
            raise ValueError(f"measuring the profile on {device} failed: {lines[-1] if lines else done.returncode}")
        return ModelProfile.from_json(out.read_text())


def main(model_yaml: str, batch_size: str, device: str, precision: str, out: str) -> int:
    from omegaconf import OmegaConf

    from ..config.choices import mapping
    from ..models.from_config import model_from_config
    from .measure import measure_profile

    model = model_from_config(mapping(OmegaConf.load(model_yaml), str(model_yaml)))
    profile = measure_profile(model, int(batch_size), device=device, precision=precision)
    Path(out).write_text(profile.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
