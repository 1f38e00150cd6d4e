"""Pure tier: a checkpoint is visible only once complete; name-keyed optimizer state round-trips."""
from __future__ import annotations

import torch

from dapple_launch.runtime import checkpoint as ckpt


def test_interrupted_save_is_never_loaded(tmp_path):
    path = tmp_path / "step000004.ckpt"
    ckpt.write_shard(path, 0, 2, {"layers.0.w": torch.ones(2)}, {})
    # crash here: the shards are written, the commit never happened
    assert not ckpt.is_complete(path) and ckpt.find_checkpoints(tmp_path) == []
    ckpt.write_meta_and_commit(path, {"global_step": 4})
    assert ckpt.find_checkpoints(tmp_path) == [path]
    assert not ckpt.tmp_dir(path).exists()
    # a second save of the same name replaces it whole
    ckpt.write_shard(path, 0, 2, {"layers.0.w": torch.zeros(2)}, {})
    ckpt.write_meta_and_commit(path, {"global_step": 4})
    state, _ = ckpt.read_shards(path)
    assert torch.equal(state["layers.0.w"], torch.zeros(2))


def test_optimizer_state_survives_a_layout_change():
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([a, b], lr=0.1)
    (a.sum() + b.sum()).backward()
    opt.step()
    by_name = ckpt.optimizer_state_by_name(opt.state_dict(), [["layers.0.a", "layers.5.b"]])
    # another layout holds only layer 5
    c = torch.nn.Parameter(torch.ones(3))
    other = torch.optim.AdamW([c], lr=0.1)
    other.load_state_dict(ckpt.optimizer_state_by_index(by_name, other.state_dict(), [["layers.5.b"]]))
    assert torch.equal(other.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][1]["exp_avg"])
