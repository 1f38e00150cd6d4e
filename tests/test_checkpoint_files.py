"""Pure tier: a checkpoint is visible only once complete, verified before it is read, and read only
through its manifest; name-keyed optimizer state round-trips."""

from __future__ import annotations

import os

import pytest
import torch

from dapple_launch.runtime import checkpoint as ckpt


def save(root, step, value=1.0, shards=((0, 2), (2, 4))):
    path = root / f"step{step:06d}.ckpt"
    tmp = ckpt.fresh_tmp(path, f"n{step}")
    for a, b in shards:
        ckpt.write_shard(tmp, a, b, {f"layers.{a}.w": torch.full((4,), value)}, {})
    ckpt.commit(path, tmp, {"global_step": step}, step)
    return path


def test_interrupted_save_is_never_loaded(tmp_path):
    path = tmp_path / "step000004.ckpt"
    tmp = ckpt.fresh_tmp(path, "abc")
    ckpt.write_shard(tmp, 0, 2, {"layers.0.w": torch.ones(2)}, {})
    # crash here: the shards are written, the commit never happened
    assert not ckpt.is_complete(path) and ckpt.find_checkpoints(tmp_path) == []
    assert ckpt.crash_leftovers(tmp_path) == [tmp]
    save(tmp_path, 4)
    assert ckpt.find_checkpoints(tmp_path) == [path] and ckpt.verify(path)["step"] == 4
    # a second save of the same step replaces it whole
    save(tmp_path, 4, value=0.0)
    state, _ = ckpt.read_shards(path)
    assert torch.equal(state["layers.0.w"], torch.zeros(4))
    assert ckpt.remove_leftovers(tmp_path) == [tmp] and ckpt.crash_leftovers(tmp_path) == []


@pytest.mark.parametrize(
    "damage,needle",
    [
        ("flip", "does not match its checksum"),
        ("truncate", "bytes but was written with"),
        ("delete", "is missing (the manifest lists it)"),
        ("meta", "meta.pt does not match its checksum"),
        ("manifest", "manifest.json is missing"),
    ],
)
def test_damage_is_found_and_named_and_nothing_is_changed(tmp_path, damage, needle):
    path = save(tmp_path, 8)
    shard = path / "stage-00002-00004.pt"
    if damage == "flip":
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-10])
    elif damage == "delete":
        shard.unlink()
    elif damage == "meta":
        with open(path / "meta.pt", "r+b") as f:
            f.seek(10)
            f.write(b"\x00\x01\x02")
    else:
        (path / "manifest.json").unlink()
    before = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir())
    with pytest.raises(ckpt.CheckpointError, match="stage-00002-00004.pt|meta.pt|manifest.json") as e:
        ckpt.verify(path)
    assert needle in str(e.value)
    assert sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir()) == before


def test_last_never_falls_back_silently(tmp_path):
    old, new = save(tmp_path, 10), save(tmp_path, 20)
    assert ckpt.newest_intact(tmp_path) == new
    data = bytearray((new / "stage-00000-00002.pt").read_bytes())
    data[-5] ^= 1
    (new / "stage-00000-00002.pt").write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.newest_intact(tmp_path)
    text = str(e.value)
    assert "step000020.ckpt (step 20) is damaged" in text and f"ckpt_path={old}" in text


def test_an_unreadable_meta_does_not_reorder_checkpoints(tmp_path):
    """The step comes from the manifest (or the name), never from loading meta.pt."""
    save(tmp_path, 10)
    new = save(tmp_path, 20)
    (new / "meta.pt").write_bytes(b"garbage")
    assert [p.name for p in ckpt.find_checkpoints(tmp_path)] == ["step000010.ckpt", "step000020.ckpt"]
    with pytest.raises(ckpt.CheckpointError, match="meta.pt"):
        ckpt.read_meta(new)


def test_a_stray_shard_in_a_checkpoint_is_never_read(tmp_path):
    """Only what the manifest lists is read: a shard of another layout dropped into the directory
    (what a crashed save of another layout used to leave) supplies nothing."""
    path = save(tmp_path, 6, shards=((0, 4),))
    torch.save({"state_dict": {"layers.3.w": torch.full((4,), 99.0)}, "optimizer": {}}, path / "stage-00003-00004.pt")
    state, _ = ckpt.read_shards(path)
    assert torch.equal(state["layers.0.w"], torch.ones(4)) and "layers.3.w" not in state


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


def test_a_save_is_durable_before_it_is_visible(tmp_path):
    path = save(tmp_path, 3)
    m = ckpt.manifest(path)
    assert set(m["files"]) == {"stage-00000-00002.pt", "stage-00002-00004.pt", "meta.pt"}
    for name, entry in m["files"].items():
        assert os.path.getsize(path / name) == entry["size"] and ckpt.sha256_of(path / name) == entry["sha256"]
    assert not list(path.glob("*.sum"))
