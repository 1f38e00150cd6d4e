"""The fault tier (`pytest -m faults`): interrupts, dead and stalled ranks, damaged and contested
checkpoints, full and read-only disks. Real process trees, real signals, real files."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from dapple_launch.runtime.checkpoint import find_checkpoints, read_shards, step_of

from .conftest import FAST, Launch, first_error, no_process_left, record, run_to_end, signal_names

pytestmark = pytest.mark.faults


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_saves_the_step_and_resume_is_exact(tmp_path, straight, sig):
    """Ctrl-C (or a `kill`) mid-run: every rank finishes the step, they save it together, nothing is
    left running, the launcher says how to resume; the resumed run ends bit-identical."""
    run = tmp_path / "run"
    args = [*FAST, "trainer.max_steps=60", "trainer.checkpoint_every_n_steps=1000"]
    launch = Launch(args, run)
    launch.wait_for_step(12)
    sent = launch.signal_terminal(sig)
    code = launch.wait(timeout=120)
    took = time.time() - sent
    assert code == 128 + sig, launch.stderr
    assert no_process_left(launch)
    (saved,) = find_checkpoints(run / "checkpoints")
    step = step_of(saved)
    assert 12 <= step < 60
    assert f"the last completed step is saved in {saved}" in launch.stderr and "ckpt_path=last" in launch.stderr
    record(f"{signal_names[sig]} mid-run", took, f"nothing: step {step} saved", first_error(launch.stderr))
    out = run_to_end([*args, "ckpt_path=last"], run)
    assert out.returncode == 0, out.stdout + out.stderr
    state, _ = read_shards(find_checkpoints(run / "checkpoints")[-1])
    assert same_weights(state, straight)


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    run = tmp_path / "run"
    launch = Launch([*FAST, "trainer.max_steps=100000", "trainer.checkpoint_every_n_steps=20"], run)
    launch.wait_for_step(25)
    sent = launch.signal_terminal(signal.SIGINT)
    while "press Ctrl-C again" not in launch.stderr:  # a person presses again after seeing the first answer
        time.sleep(0.02)
    launch.signal_terminal(signal.SIGINT)
    code = launch.wait(timeout=30)
    took = time.time() - sent
    assert code == 130 and "stopped at once" in launch.stderr, launch.stderr
    assert no_process_left(launch)
    newest = find_checkpoints(run / "checkpoints")[-1]
    record(
        "second Ctrl-C",
        took,
        f"the steps after the newest checkpoint (step {step_of(newest)})",
        first_error(launch.stderr),
    )


def test_a_killed_rank_is_named_and_the_run_ends(tmp_path):
    run = tmp_path / "run"
    launch = Launch([*FAST, "trainer.max_steps=100000", "trainer.checkpoint_every_n_steps=20"], run)
    launch.wait_for_step(25)
    rank = 2
    victim = launch.rank_pids()[rank]
    sent = time.time()
    subprocess.run(["kill", "-9", str(victim)], check=True)
    code = launch.wait(timeout=60)
    took = time.time() - sent
    assert code != 0 and no_process_left(launch)
    line = first_error(launch.stderr)
    assert f"rank {rank} (stage" in line and "killed by SIGKILL" in line and "ckpt_path=last" in line, launch.stderr
    assert took < 15
    newest = find_checkpoints(run / "checkpoints")[-1]
    record("a rank SIGKILLed", took, f"the steps after step {step_of(newest)}", line)


def test_a_stalled_rank_is_named_within_the_timeout(tmp_path):
    run = tmp_path / "run"
    timeout = 12
    launch = Launch(
        [*FAST, "trainer.max_steps=100000", "trainer.checkpoint_every_n_steps=20", f"trainer.timeout_s={timeout}"], run
    )
    launch.wait_for_step(25)
    rank = 1
    victim = launch.rank_pids()[rank]
    sent = time.time()
    subprocess.run(["kill", "-STOP", str(victim)], check=True)
    try:
        code = launch.wait(timeout=timeout + 30)
    finally:
        subprocess.run(["kill", "-CONT", str(victim)], capture_output=True)
    took = time.time() - sent
    assert code != 0 and no_process_left(launch)
    line = first_error(launch.stderr)
    assert f"rank {rank} (stage" in line and "stopped making progress" in line and "only waiting on it" in line, line
    assert took < timeout + 10
    newest = find_checkpoints(run / "checkpoints")[-1]
    record("a rank SIGSTOPped (timeout 12 s)", took, f"the steps after step {step_of(newest)}", line)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A run with checkpoints at steps 4 and 8 (4 ranks, 2 stages × 2 replicas)."""
    run = tmp_path_factory.mktemp("saved") / "run"
    out = run_to_end([*FAST, "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=4"], run)
    assert out.returncode == 0, out.stderr
    return run


def _snapshot(d: Path) -> list:
    return sorted((str(p.relative_to(d)), p.stat().st_size, p.stat().st_mtime_ns) for p in d.rglob("*") if p.is_file())


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "meta"])
def test_a_damaged_checkpoint_is_refused_naming_the_file(tmp_path, saved_run, damage):
    run = tmp_path / "run"
    shutil.copytree(saved_run, run, symlinks=True)
    newest = find_checkpoints(run / "checkpoints")[-1]
    target = newest / "meta.pt" if damage == "meta" else sorted(newest.glob("stage-*.pt"))[0]
    if damage in ("flip", "meta"):
        data = bytearray(target.read_bytes())
        for i in range(64):  # 64 flipped bytes, as the injection
            data[(len(data) // 3 + 97 * i) % len(data)] ^= 0x5A
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        target.unlink()
    before = _snapshot(run / "checkpoints")
    shutil.rmtree(run / "logs" / "heartbeat")  # the first run's: a rank that starts writes one again
    started = time.time()
    out = run_to_end([*FAST, "trainer.max_steps=12", "trainer.checkpoint_every_n_steps=4", "ckpt_path=last"], run)
    took = time.time() - started
    assert out.returncode == 2, out.stdout + out.stderr
    assert target.name in out.stderr and "damaged" in out.stderr and "step000004.ckpt" in out.stderr
    assert "Traceback" not in out.stderr and not (run / "logs" / "heartbeat").exists()
    assert _snapshot(run / "checkpoints") == before
    # the one it names resumes
    record(f"checkpoint: {damage}", took, "nothing (refused before any rank started)", first_error(out.stderr))
    older = find_checkpoints(run / "checkpoints")[0]
    out = run_to_end(
        [*FAST, "trainer.max_steps=12", "trainer.checkpoint_every_n_steps=4", f"ckpt_path={older}", "overwrite=true"],
        tmp_path / "again",
    )
    assert out.returncode == 0, out.stderr


def test_a_crash_mid_save_then_a_resume_on_another_layout_uses_no_stale_shard(tmp_path):
    """Kill the whole launch while it saves every step until a save is caught unfinished; resume
    on 4 stages × 1: the leftover is removed, and the new checkpoints hold only the new layout."""
    run = tmp_path / "run"
    # wide enough that a save (shards of ~25 MB, written and made durable) outlasts the kill
    args = [
        *FAST,
        "model.hidden=384",
        "trainer.max_steps=100000",
        "trainer.checkpoint_every_n_steps=1",
        "trainer.keep_checkpoints=1000",
    ]
    for attempt in range(5):
        shutil.rmtree(run, ignore_errors=True)
        launch = Launch(args, run)
        launch.wait_for_step(4 + attempt)
        ckpts = run / "checkpoints"
        while not any(".tmp-" in p.name for p in ckpts.iterdir()):  # a save is under way: crash now
            assert launch.proc.poll() is None
        launch.signal_terminal(signal.SIGKILL)  # the launcher dies; its ranks die with it
        launch.wait(timeout=30)
        assert no_process_left(launch)
        leftovers = [p for p in ckpts.iterdir() if ".tmp-" in p.name]
        if leftovers:
            break
    else:
        raise AssertionError("five kills during a save left no unfinished save behind")
    newest = find_checkpoints(run / "checkpoints")[-1]
    out = run_to_end(
        [
            *FAST,
            "model.hidden=384",
            "strategy.stages=4",
            "strategy.replicas=[1]",
            f"trainer.max_steps={step_of(newest) + 2}",
            "trainer.checkpoint_every_n_steps=1",
            "ckpt_path=last",
        ],
        run,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "an unfinished save a crash left behind" in out.stdout
    assert not [p for p in (run / "checkpoints").iterdir() if ".tmp" in p.name]
    final = find_checkpoints(run / "checkpoints")[-1]
    listed = json.loads((final / "manifest.json").read_text())["files"]
    assert sorted(n for n in listed if n.startswith("stage-")) == [
        "stage-00000-00001.pt",
        "stage-00001-00002.pt",
        "stage-00002-00003.pt",
        "stage-00003-00004.pt",
    ]
    record(
        "crash mid-save, resume on 4 × 1",
        None,
        f"the unfinished save (step {step_of(newest) + 1})",
        f"removed {leftovers[0].name}: an unfinished save a crash left behind",
    )


def test_two_launches_into_one_directory(tmp_path):
    """The second is refused while the first runs, naming its pid and host; the first ends with its
    own seed's weights."""
    run = tmp_path / "run"
    first = Launch([*FAST, "trainer.max_steps=250", "trainer.checkpoint_every_n_steps=100", "trainer.seed=1"], run)
    first.wait_for_step(3)
    started = time.time()
    second = run_to_end([*FAST, "trainer.max_steps=250", "trainer.seed=2"], run)
    took = time.time() - started
    assert first.proc.poll() is None, "the first launch ended before the second was refused"
    assert second.returncode == 2 and f"pid {first.proc.pid}" in second.stderr and "in use" in second.stderr, (
        second.stderr
    )
    assert first.wait(timeout=120) == 0, first.stderr
    from omegaconf import OmegaConf

    assert OmegaConf.load(run / "config.yaml").trainer.seed == 1
    record("two launches into one directory", took, "nothing: the second is refused", first_error(second.stderr))


NAMESPACE = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c"]


def _namespaced(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run a shell script in a private mount namespace (a tiny or read-only filesystem of our own)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare: cannot make a private filesystem")
    probe = subprocess.run([*NAMESPACE, "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"user and mount namespaces unavailable here: {probe.stderr.decode().strip()}")
    import sys

    return subprocess.run(
        [*NAMESPACE, script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
        env={**__import__("os").environ, "WANDB_MODE": "disabled", "PYTHON": sys.executable},
    )


def test_a_read_only_run_directory_is_one_line(tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    args = " ".join([*FAST, "trainer.max_steps=2"])
    out = _namespaced(
        f"mount -t tmpfs -o size=4m tmpfs {mount} && mount -o remount,ro {mount} && "
        f"$PYTHON -m dapple_launch {args} hydra.run.dir={mount}/run",
        tmp_path,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"cannot write {mount}/run" in out.stderr and "Read-only file system" in out.stderr
    assert "Traceback" not in out.stderr
    record("read-only run directory", None, "nothing: refused before anything starts", first_error(out.stderr))


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(tmp_path):
    """A 1.5 MiB filesystem: the first saves fit, a later one runs out of space. The run stops with
    "No space left on device", no rank is left, the checkpoints before it verify."""
    mount = tmp_path / "small"
    mount.mkdir()
    args = " ".join(
        [
            *FAST,
            "trainer.max_steps=400",
            "trainer.checkpoint_every_n_steps=20",
            "trainer.keep_checkpoints=100",
            "logger=none",
        ]
    )
    out = _namespaced(
        f"mount -t tmpfs -o size=1536k tmpfs {mount} && "
        f"$PYTHON -m dapple_launch {args} hydra.run.dir={mount}/run; echo rc=$?; "
        f'$PYTHON -c "from dapple_launch.runtime.checkpoint import find_checkpoints, verify; '
        f"f = find_checkpoints('{mount}/run/checkpoints'); [verify(p) for p in f]; "
        f"print('intact', [p.name for p in f])\"; ls -a {mount}/run/checkpoints",
        tmp_path,
    )
    text = out.stdout + out.stderr
    assert "rc=1" in out.stdout, text
    assert "No space left on device" in out.stderr and "the checkpoints saved before are intact" in out.stderr, text
    assert "intact ['step0000" in out.stdout, text
    assert ".tmp-" not in out.stdout.split("intact")[1], text  # the unfinished save was removed
    record("full disk during a save", None, "the steps since the last checkpoint", first_error(out.stderr))


def test_a_non_finite_run_skips_its_steps_stops_and_keeps_only_finite_checkpoints(tmp_path):
    """trainer.lr=1e37 throws the weights beyond fp32 at the first step (its gradients were finite):
    every later loss is NaN. Each such step is skipped on every rank and counted; at
    trainer.max_bad_steps in a row the run stops with one line naming the first bad step; every save
    of the non-finite weights is refused on every rank, so no such checkpoint exists."""
    run = tmp_path / "run"
    started = time.time()
    bad = run_to_end(
        [
            *FAST,
            "trainer.checkpoint_every_n_steps=1",
            "trainer.max_steps=40",
            "trainer.lr=1e37",
            "trainer.warmup_steps=0",
            "trainer.max_bad_steps=4",
        ],
        run,
    )
    took = time.time() - started
    assert bad.returncode != 0
    line = first_error(bad.stderr)
    assert "4 steps in a row had a non-finite loss or gradient norm, the first at step 2" in line, bad.stderr
    assert "weights of step 1" in line and "no checkpoint was saved" in line, line
    out = bad.stderr + bad.stdout
    assert "step 2: non-finite loss or gradient norm; skipped on every rank (1 in a row" in out, out
    assert "step 1 not saved: 4 rank(s) hold an inf or NaN weight" in out, out
    assert find_checkpoints(run / "checkpoints") == []
    record("non-finite loss (trainer.lr=1e37)", took, "steps 2-5 skipped; no checkpoint of non-finite weights", line)


def test_a_save_refused_for_non_finite_values_rotates_nothing(tmp_path):
    """No checkpoint of inf or NaN values is written, and the refusal deletes none of the finite ones."""
    from dapple_launch.runtime.checkpoint import NonFiniteState, all_finite
    from dapple_launch.runtime.checkpointing import Checkpointing

    assert all_finite([torch.ones(3)]) and not all_finite([torch.ones(3), torch.tensor([float("nan")])])
    assert not all_finite([torch.tensor([float("inf")])])
    saving = Checkpointing(tmp_path, 1, 1)
    for step in (1, 2):
        (tmp_path / f"step{step:06d}.ckpt").mkdir()

    class Refusing:
        global_step, is_global_zero = 3, True

        def save_checkpoint(self, path):
            raise NonFiniteState("1 rank(s) hold an inf or NaN weight")

    assert saving.save(Refusing()) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step000001.ckpt", "step000002.ckpt"]
