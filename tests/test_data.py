"""One process: the data every stage reads, epoch by epoch, and where a resumed run continues."""

from __future__ import annotations

from lightning.fabric.utilities.data import _set_sampler_epoch
from torch.utils.data import DataLoader

from dapple_launch.data.datasets import GlobalBatchSampler


def loader(sampler):
    return DataLoader(list(range(64)), batch_sampler=sampler)


def test_lightning_reshuffles_every_epoch():
    s = GlobalBatchSampler(64, 8, seed=3, shuffle=True)
    dl = loader(s)
    _set_sampler_epoch(dl, 0)  # what Lightning's fit loop calls at each epoch start
    first = list(s)
    _set_sampler_epoch(dl, 1)
    second = list(s)
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(64))


def test_resume_mid_epoch_continues_with_the_next_batch():
    s = GlobalBatchSampler(64, 8, seed=3, shuffle=True)
    _set_sampler_epoch(loader(s), 2)
    full = list(s)
    r = GlobalBatchSampler(64, 8, seed=3, shuffle=True)
    r.resume = (2, 3)
    _set_sampler_epoch(loader(r), 2)
    assert list(r) == full[3:]
    assert len(r) == len(s)  # Lightning's epoch length stays the full epoch


# ---- your data: text files and token files ------------------------------------------------------
import json  # noqa: E402
import sysconfig  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from dapple_launch.data import files  # noqa: E402
from dapple_launch.data.prepare import prepare  # noqa: E402
from dapple_launch.models import build_model  # noqa: E402

from .conftest import cli  # noqa: E402

# A real text nobody here wrote: the license that ships with the Python installation.
LICENSE = Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"
BYTE_GPT = ["model.num_layers=2", "model.hidden=32", "model.heads=2", "model.seq_len=32", "model.vocab_size=256"]


def data_cfg(kind, path, **kw):
    return OmegaConf.create(
        {"kind": kind, "path": str(path), "seq_len": None, "val_fraction": 0.05, "dtype": "uint16", **kw}
    )


def test_text_windows_are_the_file_bytes_with_next_token_targets():
    model = build_model("gpt", "tiny", seq_len=32, vocab_size=256)
    train, val = files.datasets(data_cfg("text_file", LICENSE), model, seed=1)
    raw = LICENSE.read_bytes()
    windows = (len(raw) - 1) // 32
    assert len(train) + len(val) == windows and len(val) == round(windows * 0.05)
    x, y = train[3]
    assert bytes(x.tolist()) == raw[96:128] and bytes(y.tolist()) == raw[97:129]
    vx, _ = val[0]  # the held-out tail follows the training windows
    assert bytes(vx.tolist()) == raw[len(train) * 32 : len(train) * 32 + 32]


def test_a_prepared_token_file_gives_the_same_windows(tmp_path):
    out = tmp_path / "license.bin"
    assert prepare(LICENSE, out, "uint16") == LICENSE.stat().st_size
    assert (
        np.fromfile(out, dtype=np.uint16).tobytes()
        == np.frombuffer(LICENSE.read_bytes(), np.uint8).astype(np.uint16).tobytes()
    )
    model = build_model("gpt", "tiny", seq_len=16, vocab_size=256)
    a, _ = files.datasets(data_cfg("text_file", LICENSE), model, seed=1)
    b, _ = files.datasets(data_cfg("tokens", out), model, seed=1)
    for i in (0, 7, len(a) - 1):
        assert all(torch.equal(p, q) for p, q in zip(a[i], b[i]))


def test_bert_masks_file_windows_the_same_way_on_every_read():
    model = build_model("bert", "tiny", seq_len=16, vocab_size=256)
    train, _ = files.datasets(data_cfg("text_file", LICENSE), model, seed=1)
    (x1, y1), (x2, y2) = train[5], train[5]
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and (x1 == 0).any() and (y1 != -100).sum() == (x1 == 0).sum()


@pytest.mark.parametrize(
    "case,needle",
    [
        ("missing", "does not exist"),
        ("empty", "is empty: it holds no tokens"),
        ("short", "fewer than one window of data.seq_len + 1 = 33"),
        ("vocab", "holds token id 122 but model gpt has vocab_size 64"),
        ("few", "fewer than one global batch of 16"),
        ("empty_dir", "is a directory with no files"),
    ],
)
@pytest.mark.slow
def test_bad_data_is_refused_before_any_process_starts(tmp_path, case, needle):
    path = {
        "missing": tmp_path / "nope.txt",
        "empty": tmp_path / "empty.txt",
        "short": tmp_path / "short.txt",
        "vocab": LICENSE,
        "few": tmp_path / "few.txt",
        "empty_dir": tmp_path / "d",
    }[case]
    if case == "empty":
        path.write_bytes(b"")
    if case == "short":
        path.write_text("too short")
    if case == "few":
        path.write_bytes(LICENSE.read_bytes()[: 33 * 12])
    if case == "empty_dir":
        path.mkdir()
    args = [*BYTE_GPT, "data=text_file", f"data.path={path}", f"hydra.run.dir={tmp_path}/run"]
    if case == "vocab":
        args = [a for a in args if a != "model.vocab_size=256"]
    out = cli(args, tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert needle in out.stderr and "data.path" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run" / "logs").exists()


@pytest.mark.slow
def test_token_ids_beyond_the_vocabulary_are_refused(tmp_path):
    ids = tmp_path / "ids.bin"
    np.array([1, 2, 3, 70_000 % 65536, 5] * 400, dtype=np.uint16).tofile(ids)
    out = cli([*BYTE_GPT, "data=tokens", f"data.path={ids}", f"hydra.run.dir={tmp_path}/r"], tmp_path)
    assert out.returncode == 2 and "holds token id 4464 but model gpt has vocab_size 256" in out.stderr, out.stderr


def _metrics(run: Path, key: str) -> dict[int, float]:
    import csv

    (metrics,) = run.rglob("metrics.csv")
    return {int(r["step"]): float(r[key]) for r in csv.DictReader(metrics.open()) if r.get(key)}


FILE_RUN = [
    *BYTE_GPT,
    "trainer.val_check_interval=6",
    "trainer.limit_val_batches=2",
    "trainer.log_every_n_steps=1",
    "trainer.lr_decay_steps=12",
    "trainer.warmup_steps=2",
    "trainer.progress_bar=false",
    "trainer.checkpoint_every_n_steps=6",
    "trainer.lr=1e-2",
]


@pytest.mark.multiprocess
def test_training_on_a_text_file_learns_and_resumes_exactly(tmp_path):
    """2 stages × 2 replicas on the license text: the validation loss falls; 6 steps, stop, resume
    to 12 ends with the weights of 12 steps straight."""
    from dapple_launch.runtime.checkpoint import find_checkpoints, read_shards

    straight, split_run = tmp_path / "straight", tmp_path / "split"
    data = ["data=text_file", f"data.path={LICENSE}"]
    out = cli([*FILE_RUN, *data, "trainer.max_steps=12", f"hydra.run.dir={straight}"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    val = _metrics(straight, "val_loss")
    assert sorted(val) == [5, 11] and val[11] < val[5] < np.log(256), val
    out = cli([*FILE_RUN, *data, "trainer.max_steps=6", f"hydra.run.dir={split_run}"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    out = cli([*FILE_RUN, *data, "trainer.max_steps=12", "ckpt_path=last", f"hydra.run.dir={split_run}"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    a, _ = read_shards(find_checkpoints(straight / "checkpoints")[-1])
    b, _ = read_shards(find_checkpoints(split_run / "checkpoints")[-1])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # GPT ties its embedding and output weights: the checkpoint holds the weight once
    assert "layers.0.token.weight" in a and "layers.3.out.weight" not in a


@pytest.mark.multiprocess
def test_training_on_a_prepared_token_file(tmp_path):
    ids = tmp_path / "license.bin"
    out = cli([], tmp_path, module=["dapple_launch.data.prepare", str(LICENSE), str(ids)])
    assert out.returncode == 0 and "data=tokens" in out.stdout, out.stderr
    run = tmp_path / "run"
    out = cli(
        [
            *FILE_RUN,
            "data=tokens",
            f"data.path={ids}",
            "data.dtype=uint16",
            "trainer.max_steps=6",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads((run / "plan.json").read_text())["stages"][0]["replicas"] == 2
    losses = _metrics(run, "train_loss")
    assert losses[max(losses)] < losses[min(losses)]
