"""The multi-node tier (`pytest -m nodes`): the product's own command on a Slurm of two nodes, each a
Linux network and UTS namespace with its own hostname and address (slurm/dev-cluster.sh start
--nodes 2). Skipped, with the reason, where no such cluster is up."""
from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import torch

from dapple_launch.runtime.checkpoint import find_checkpoints, read_shards

from .conftest import TINY_GPT, cli
from .test_cli import losses


def _nodes_up() -> int:
    if shutil.which("sinfo") is None:
        return 0
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True).stdout.split("\n")
    return sum(1 for line in out if line.split()[1:2] and line.split()[1] in ("idle", "mixed", "allocated"))


pytestmark = [pytest.mark.nodes, pytest.mark.skipif(_nodes_up() < 2, reason="no Slurm of two nodes is up "
                                                     "(slurm/dev-cluster.sh start --nodes 2, as root)")]

LAYOUT = ["strategy=fixed", "strategy.stages=2", "strategy.replicas=[2,2]", "strategy.num_micro_batches=4"]
JOB = [*TINY_GPT, "cluster=slurm-dev", "cluster.nodes=2", "cluster.devices_per_node=2", "global_batch_size=16",
       "trainer.progress_bar=false", "trainer.log_every_n_steps=1", "trainer.val_check_interval=10",
       "trainer.limit_val_batches=1", "data.num_train=512", "data.num_val=32", "trainer.lr_decay_steps=100",
       "trainer.max_steps=12", "trainer.checkpoint_every_n_steps=6"]


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
    out = cli([*JOB, "strategy=file", f"strategy.plan_file={dry / 'plan.json'}", "launcher.wait=true",
               f"hydra.run.dir={across}"], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    logs = "".join(p.read_text() for p in (across / "slurm").glob("*_log.*"))
    nodes = {int(m.group(1)): (m.group(2), m.group(3)) for m in
             re.finditer(r"rank (\d) \(stage \d, replica \d\) on node (dapple-n\d)(?:, interface (\w+))?", logs)}
    # as placed: devices 0, 1 on the first node, 2, 3 on the second; every rank bound the bridge's interface
    assert {r: n for r, (n, _) in nodes.items()} == {0: "dapple-n1", 1: "dapple-n1", 2: "dapple-n2",
                                                     3: "dapple-n2"}, logs[-3000:]
    assert {i for _, i in nodes.values()} == {"eth0"}, nodes
    local = tmp_path / "local"
    out = cli([*JOB, "cluster=local", "cluster.nodes=2", "cluster.devices_per_node=2", "strategy=file",
               f"strategy.plan_file={dry / 'plan.json'}", "launcher=local", f"hydra.run.dir={local}"], tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert losses(across) == losses(local)
    a, _ = read_shards(find_checkpoints(across / "checkpoints")[-1])
    b, _ = read_shards(find_checkpoints(local / "checkpoints")[-1])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    newest = find_checkpoints(across / "checkpoints")[-1]
    shards = sorted(p.name for p in newest.glob("stage-*.pt"))
    assert shards == ["stage-00000-00002.pt", "stage-00002-00004.pt"], shards  # one per stage, not per node
