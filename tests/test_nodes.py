"""The multi-node tier (`pytest -m nodes`): the product's own command on a Slurm of two nodes, each a
Linux network and UTS namespace with its own hostname and address (slurm/dev-cluster.sh start
--nodes 2). Skipped, with the reason, where no such cluster is up."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dapple_launch.runtime.checkpoint import find_checkpoints, read_shards

from .conftest import TINY_GPT, cli
from .test_cli import losses


@functools.cache
def _nodes_up() -> int:
    if shutil.which("sinfo") is None:
        return 0
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True).stdout.split("\n")
    return sum(1 for line in out if line.split()[1:2] and line.split()[1] in ("idle", "mixed", "allocated"))


pytestmark = [pytest.mark.nodes]


@pytest.fixture(autouse=True)
def _two_nodes_up():
    # asked when a test of this tier is about to run, not at collection: where Slurm is installed but
    # not started, sinfo takes 2 s to fail (munge is down), which every pytest run (the fast tier's
    # two workers included) otherwise waited out while collecting
    if _nodes_up() < 2:
        pytest.skip("no Slurm of two nodes is up (slurm/dev-cluster.sh start --nodes 2, as root)")


LAYOUT = ["strategy=fixed", "strategy.stages=2", "strategy.replicas=[2,2]", "strategy.num_micro_batches=4"]
JOB = [
    *TINY_GPT,
    "cluster=slurm-dev",
    "cluster.nodes=2",
    "cluster.devices_per_node=2",
    "global_batch_size=16",
    "trainer.progress_bar=false",
    "trainer.log_every_n_steps=1",
    "trainer.val_check_interval=10",
    "trainer.limit_val_batches=1",
    "data.num_train=512",
    "data.num_val=32",
    "trainer.lr_decay_steps=100",
    "trainer.max_steps=12",
    "trainer.checkpoint_every_n_steps=6",
]


def test_a_job_across_two_nodes_trains_as_local_processes_do(tmp_path):
    """Stage 0 on node 0's first device and node 1's first, stage 1 on the second of each: every
    stage boundary and both replica groups cross the nodes. Submitted through launcher=slurm, it
    trains to the losses and weights of the same plan run as local processes; each stage's shard is
    written once."""
    dry = tmp_path / "dry"
    out = cli([*JOB, *LAYOUT, "dry_run=true", f"hydra.run.dir={dry}"], tmp_path)
    assert out.returncode == 0, out.stderr
    plan = json.loads((dry / "plan.json").read_text())
    plan["stages"][0]["devices"], plan["stages"][1]["devices"] = [0, 2], [1, 3]
    (dry / "plan.json").write_text(json.dumps(plan))
    across = tmp_path / "across"
    out = cli(
        [
            *JOB,
            "strategy=file",
            f"strategy.plan_file={dry / 'plan.json'}",
            "launcher.wait=true",
            f"hydra.run.dir={across}",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    logs = "".join(p.read_text() for p in (across / "slurm").glob("*_log.*"))
    nodes = {
        int(m.group(1)): (m.group(2), m.group(3))
        for m in re.finditer(r"rank (\d) \(stage \d, replica \d\) on node (dapple-n\d)(?:, interface (\w+))?", logs)
    }
    # as placed: devices 0, 1 on the first node, 2, 3 on the second; every rank bound the bridge's interface
    assert {r: n for r, (n, _) in nodes.items()} == {0: "dapple-n1", 1: "dapple-n1", 2: "dapple-n2", 3: "dapple-n2"}, (
        logs[-3000:]
    )
    assert {i for _, i in nodes.values()} == {"eth0"}, nodes
    local = tmp_path / "local"
    out = cli(
        [
            *JOB,
            "cluster=local",
            "cluster.nodes=2",
            "cluster.devices_per_node=2",
            "strategy=file",
            f"strategy.plan_file={dry / 'plan.json'}",
            "launcher=local",
            f"hydra.run.dir={local}",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert losses(across) == losses(local)
    a, _ = read_shards(find_checkpoints(across / "checkpoints")[-1])
    b, _ = read_shards(find_checkpoints(local / "checkpoints")[-1])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    newest = find_checkpoints(across / "checkpoints")[-1]
    shards = sorted(p.name for p in newest.glob("stage-*.pt"))
    assert shards == ["stage-00000-00002.pt", "stage-00002-00004.pt"], shards  # one per stage, not per node


# ---- a node lost mid-run ------------------------------------------------------------------------
DEV = str(Path(__file__).resolve().parents[1] / "slurm" / "dev-cluster.sh")
LONG = [
    *TINY_GPT,
    "cluster=slurm-dev",
    "cluster.nodes=2",
    "cluster.devices_per_node=2",
    "global_batch_size=16",
    "trainer.progress_bar=false",
    "trainer.val_check_interval=1000",
    "data.num_train=512",
    "trainer.lr_decay_steps=1000",
    "trainer.timeout_s=10",
    "trainer.checkpoint_every_n_steps=20",
    "trainer.max_steps=160",
    "trainer.keep_checkpoints=100",
]
AUTO = ["strategy=auto", "strategy.profile_source=analytic"]


def _dev(*args: str) -> None:
    subprocess.run(["bash", DEV, *args], check=True, capture_output=True, timeout=120)


@pytest.fixture
def node_two_returns():
    yield
    _dev("heal-node", "2")


def _step(run: Path) -> int:
    try:
        return int(json.loads((run / "logs" / "heartbeat" / "rank-0.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return -1


def _wait(what, timeout: float, every: float = 0.5):
    end = time.time() + timeout
    while time.time() < end:
        got = what()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"not within {timeout} s")


def _fate(run: Path, job: str) -> dict | None:
    try:
        return json.loads((run / "slurm" / f"fate-{job}.json").read_text())
    except (OSError, ValueError):
        return None


def _follow(args, tmp_path) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "dapple_launch", *args, "launcher.wait=true"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _first_job(run: Path) -> str:
    return _wait(lambda: (run / "slurm" / "job_id").is_file() and (run / "slurm" / "job_id").read_text().strip(), 60)


def test_a_killed_node_is_named_and_the_job_resumes_re_planned_on_the_node_left(tmp_path, node_two_returns):
    """strategy=auto on 2 nodes × 2; node 2 dies (slurmd, steps, ranks: SIGKILL) after step 30. The
    survivors name the node and its ranks, one successor job takes the node left (one job in the
    queue, never two), re-plans for 1 node × 2 and resumes the newest checkpoint; its weights end
    where the same plan, run as local processes from that checkpoint, ends. The waiting launcher
    follows the successor to its end and exits 0."""
    run = tmp_path / "run"
    launcher = _follow([*LONG, *AUTO, f"hydra.run.dir={run}"], tmp_path)
    try:
        first = _first_job(run)
        _wait(lambda: _step(run) >= 30, 180)
        killed = time.time()
        _dev("kill-node", "2")
        fate = _wait(lambda: _fate(run, first), 60)
        detected_s = fate["time"] - killed
        assert fate["state"] == "replaced", fate
        assert fate["lost"] == {"dapple-n2": [2, 3]}, fate
        assert "node dapple-n2 lost (ranks 2, 3" in fate["line"] and fate["checkpoint"] in fate["line"], fate["line"]
        assert detected_s < 10 + 10, detected_s  # within trainer.timeout_s plus a few seconds (here: far within)
        successor = fate["successor"]
        # never a pile: the lost job leaves the queue (cancelled, not requeued beside its successor)
        _wait(
            lambda: (
                not subprocess.run(
                    ["squeue", "-h", "-j", first, "-o", "%T"], capture_output=True, text=True
                ).stdout.strip()
            ),
            90,
            every=1,
        )
        out, _ = launcher.communicate(timeout=400)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 0, out[-4000:]
    assert f"job {first} was replaced by job {successor}" in out and f"job {successor} finished" in out, out[-4000:]
    assert _fate(run, successor)["state"] == "done"
    replanned = json.loads((run / "plan.json").read_text())
    assert sorted(d for s in replanned["stages"] for d in s["devices"]) == [0, 1], replanned["stages"]
    logs = "".join(p.read_text() for p in (run / "slurm").glob(f"{successor}_*_log.*"))
    assert f"resuming from {run / 'checkpoints' / fate['checkpoint']}" in logs, logs[-3000:]
    # exactly where a run of the new layout from that checkpoint goes
    local = tmp_path / "local"
    out = cli(
        [
            *LONG,
            "cluster=local",
            "cluster.nodes=1",
            "cluster.devices_per_node=2",
            "strategy=file",
            f"strategy.plan_file={run / 'plan.json'}",
            f"ckpt_path={run / 'checkpoints' / fate['checkpoint']}",
            "launcher=local",
            f"hydra.run.dir={local}",
        ],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    a, _ = read_shards(find_checkpoints(run / "checkpoints")[-1])
    b, _ = read_shards(find_checkpoints(local / "checkpoints")[-1])
    assert find_checkpoints(run / "checkpoints")[-1].name == "step000160.ckpt"
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    print(
        f"\nnode killed: detected in {detected_s:.1f} s; lost steps {fate['checkpoint']}..{fate['step']}; "
        f"{fate['line']}"
    )


def test_a_cut_link_under_a_fixed_layout_stops_the_job_with_one_line_naming_the_node(tmp_path, node_two_returns):
    """Node 2's link goes down (its ranks live on, cut off): the survivors' receives time out at
    trainer.timeout_s; they find node 2 unreachable while the controller answers, and the fixed layout
    (2 stages × 2, across the nodes) cannot run on 1 node: the job stops, nothing requeued, with one
    line naming the node and its ranks; the cut-off node's ranks see they are the ones cut off."""
    run = tmp_path / "run"
    launcher = _follow([*LONG, *LAYOUT, f"hydra.run.dir={run}"], tmp_path)
    try:
        first = _first_job(run)
        _wait(lambda: _step(run) >= 30, 180)
        cut = time.time()
        _dev("cut-link", "2")
        fate = _wait(lambda: _fate(run, first), 60)
        detected_s = fate["time"] - cut
        out, _ = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert fate["state"] == "stopped" and fate["lost"] == {"dapple-n2": [2, 3]}, fate
    assert "needs 2 nodes and 1 are left, so the job stops" in fate["line"], fate["line"]
    assert 10 <= detected_s < 10 + 10, detected_s  # the receive's timeout, then a few seconds to name the node
    assert launcher.returncode == 1 and f"job {first} stopped: node dapple-n2 lost" in out, out[-3000:]
    assert not subprocess.run(
        ["squeue", "-h", "-j", first, "-o", "%T"], capture_output=True, text=True
    ).stdout.strip() or _wait(
        lambda: not subprocess.run(["squeue", "-h", "-j", first], capture_output=True, text=True).stdout.strip(), 60
    )
    print(f"\nlink cut: detected in {detected_s:.1f} s; {fate['line']}")


def test_inside_an_allocation_cluster_from_slurm_plans_for_it_and_runs_as_a_step_of_it(tmp_path):
    """`salloc -N2 --ntasks-per-node=2 python -m dapple_launch cluster=from_slurm ...`: the dry run
    says what it read, the plan is for 2 × 2, and the ranks start as one srun step across both nodes,
    to the losses of the same plan run as local processes."""
    run = tmp_path / "run"
    args = [
        *TINY_GPT,
        "cluster=from_slurm",
        *LAYOUT,
        "global_batch_size=16",
        "trainer.progress_bar=false",
        "trainer.log_every_n_steps=1",
        "trainer.val_check_interval=1000",
        "data.num_train=512",
        "trainer.lr_decay_steps=100",
        "trainer.max_steps=8",
        f"hydra.run.dir={run}",
    ]
    out = subprocess.run(
        ["salloc", "-N2", "--ntasks-per-node=2", sys.executable, "-m", "dapple_launch", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert re.search(
        r"cluster=from_slurm read job \d+: 2 node\(s\) \(dapple-n1,dapple-n2\) × 2 CPU tasks per node", text
    )
    assert sum(len(st["devices"]) for st in json.loads((run / "plan.json").read_text())["stages"]) == 4
    nodes = set(re.findall(r"rank \d \(stage \d, replica \d\) on node (dapple-n\d)", text))
    assert nodes == {"dapple-n1", "dapple-n2"}, text[-3000:]
    local = tmp_path / "local"
    out = cli(
        [*args[:-1], "cluster=local", "cluster.nodes=2", "cluster.devices_per_node=2", f"hydra.run.dir={local}"],
        tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert losses(run) == losses(local)


def test_a_waiting_launcher_names_the_node_its_job_waits_for(tmp_path):
    """Node 2 drained: a 2-node job pends, and launcher.wait=true says it waits for dapple-n2; the node
    resumed, the job runs to its end and the launcher reports it finished (from squeue and the run
    directory's fate file, not submitit's result files)."""
    subprocess.run(["scontrol", "update", "nodename=dapple-n2", "state=drain", "reason=dapple-test"], check=True)
    run = tmp_path / "run"
    try:
        launcher = _follow([*JOB, *LAYOUT, "trainer.max_steps=4", f"hydra.run.dir={run}"], tmp_path)
        first = _first_job(run)
        lines: list[str] = []
        for line in launcher.stdout:
            lines.append(line)
            if "waiting for node" in line:
                break
        assert any(f"job {first} is pending" in ln and "waiting for node(s) dapple-n2" in ln for ln in lines), lines
    finally:
        subprocess.run(["scontrol", "update", "nodename=dapple-n2", "state=resume"], check=False)
    out, _ = launcher.communicate(timeout=300)
    assert launcher.returncode == 0 and f"job {first} finished" in out, "".join(lines) + out
