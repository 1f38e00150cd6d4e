"""A GPU run is a GPU run: refused in one line before anything starts where it could not be one;
the Slurm sweep asks for the GPUs; NCCL's flight recorder is on."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from dapple_launch.launch.devices import cuda_missing, nccl_env

from .conftest import TINY_GPT, cli

GPU_LOCAL = ["cluster=h100x8", "cluster.devices_per_node=2", "launcher=local", "trainer.max_steps=2", *TINY_GPT, "strategy=fixed",
             "strategy.stages=2", "strategy.replicas=[1,1]", "strategy.num_micro_batches=2", "global_batch_size=4"]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a usable GPU: nothing to refuse")
def test_a_gpu_cluster_without_cuda_is_refused_before_any_rank_starts(tmp_path):
    out = cli([*GPU_LOCAL, f"hydra.run.dir={tmp_path}/run"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    line = out.stderr.strip().splitlines()[-1]
    assert "cluster.device_kind=gpu but torch" in line and "cluster.device_kind=cpu" in line, line
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "run" / "logs").exists()  # no rank started


@pytest.mark.slow
def test_a_multi_node_gpu_plan_under_the_local_launcher_is_refused(tmp_path):
    out = cli([*GPU_LOCAL, "cluster.nodes=2", "cluster.devices_per_node=1", f"hydra.run.dir={tmp_path}/run"],
              tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "places ranks on 2 nodes, but launcher=local" in out.stderr and "launcher=slurm" in out.stderr
    assert not (tmp_path / "run" / "logs").exists()


def test_this_machines_cuda_is_described_truthfully():
    why = cuda_missing()
    assert (why is None) == torch.cuda.is_available()
    if torch.version.cuda is None:
        assert "CPU-only build" in why


def test_the_flight_recorder_is_on_and_the_users_settings_win(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    env = nccl_env(tmp_path)
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].startswith(str(tmp_path / "logs"))
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "77")
    assert nccl_env(tmp_path)["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "77"


@pytest.mark.parametrize("cluster,gpus", [("h100x8", 8), ("slurm-dev", None)])
def test_the_slurm_sweep_requests_the_nodes_gpus(cluster, gpus):
    from hydra import compose, initialize_config_dir

    from dapple_launch.config import CONF_DIR
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"cluster={cluster}", "hydra/launcher=dapple_slurm"],
                      return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert launcher["gpus_per_node"].startswith("${dapple_gpus_per_node:")
    from dapple_launch.config import _gpus_per_node
    assert _gpus_per_node(cfg.cluster.device_kind, cfg.cluster.devices_per_node) == gpus
