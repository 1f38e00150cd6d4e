"""The DAPPLE profiles shipped inside the package, named without a path (`bert-48-pbs-2`).

profiles/index.json states each one's profile batch size and the factor that corrects its
parameter unit (vgg-19-pbs-32.txt states MiB × 10^6 where it means bytes).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"


@lru_cache(maxsize=1)
def bundled() -> dict[str, dict]:
    return json.loads((PROFILE_DIR / "index.json").read_text())


def locate(profile: str, batch_size: int | None, parameter_scale: float | None) -> tuple[Path, int, float]:
    """(file, profile batch size, parameter scale) of `profile`: a shipped profile's name (with or
    without .txt) or a path. An unstated batch size is the shipped profile's, or a "-pbs-N" in the
    file's name."""
    name = profile[:-4] if profile.endswith(".txt") else profile
    known = bundled().get(Path(name).name) if "/" not in profile else None
    if known is not None and not Path(profile).is_file():
        path = PROFILE_DIR / f"{Path(name).name}.txt"
        return path, batch_size or known["batch_size"], parameter_scale or known["parameter_scale"]
    path = Path(profile).expanduser()
    if not path.is_file():
        raise ValueError(
            f"model.profile={profile}: no such file, and not one of the shipped profiles "
            f"({', '.join(sorted(bundled()))})"
        )
    if batch_size is None:
        m = re.search(r"-pbs-(\d+)", path.stem)
        if not m:
            raise ValueError(
                f"model.profile={profile}: its profile batch size is unknown (no '-pbs-N' in the file "
                f"name); set model.profile_batch_size to the batch its times were measured at"
            )
        batch_size = int(m.group(1))
    return path, batch_size, parameter_scale or 1.0
