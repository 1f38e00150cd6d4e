"""A GPU run is a GPU run: refused in one line before anything starts where it could not be one;
the Slurm sweep asks for the GPUs; NCCL's flight recorder is on."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from dapple_launch.host import cuda_missing
from dapple_launch.launch.devices import nccl_env

from .conftest import TINY_GPT, cli

GPU_LOCAL = [
    "cluster=h100x8",
    "cluster.devices_per_node=2",
    "launcher=local",
    "trainer.max_steps=2",
    *TINY_GPT,
    "strategy=fixed",
    "strategy.stages=2",
    "strategy.replicas=[1,1]",
    "strategy.num_micro_batches=2",
    "global_batch_size=4",
]


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
    out = cli([*GPU_LOCAL, "cluster.nodes=2", "cluster.devices_per_node=1", f"hydra.run.dir={tmp_path}/run"], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "places ranks on 2 nodes, but launcher=local" in out.stderr and "launcher=slurm" in out.stderr
    assert not (tmp_path / "run" / "logs").exists()


def test_this_machines_cuda_is_described_truthfully():
    why = cuda_missing()
    assert (why is None) == torch.cuda.is_available()
    if torch.version.cuda is None:
        assert "CPU-only build" in why


@pytest.mark.parametrize(
    "version,buffer,dump",
    [
        (
            "2.13.0+cpu",
            "TORCH_FR_BUFFER_SIZE",
            "TORCH_FR_DUMP_TEMP_FILE",
        ),  # torch 2.9 renamed them and warns on the old
        ("2.8.1", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
    ],
)
def test_the_flight_recorder_is_on_and_the_users_settings_win(tmp_path, monkeypatch, version, buffer, dump):
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", raising=False)
    env = nccl_env(tmp_path, version)
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(env[buffer]) > 0
    assert env[dump].startswith(str(tmp_path / "logs"))
    assert len(env) == 4  # one name each: the other would be warned about, or ignored
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "77")  # the user's, under the old name: kept, not doubled
    env = nccl_env(tmp_path, version)
    assert env.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "77") == "77" and "TORCH_FR_BUFFER_SIZE" not in env


@pytest.mark.parametrize("cluster,gpus", [("h100x8", 8), ("slurm-dev", None)])
def test_the_slurm_sweep_requests_the_nodes_gpus(cluster, gpus):
    from hydra import compose, initialize_config_dir

    from dapple_launch.config import CONF_DIR

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config", overrides=[f"cluster={cluster}", "hydra/launcher=dapple_slurm"], return_hydra_config=True
        )
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    assert launcher["gpus_per_node"].startswith("${dapple_gpus_per_node:")
    from dapple_launch.config import _gpus_per_node

    assert _gpus_per_node(cfg.cluster.device_kind, cfg.cluster.devices_per_node) == gpus


@pytest.mark.slow
def test_a_measured_profile_taken_in_its_own_process_equals_one_taken_here(tmp_path, monkeypatch):
    """The job the planner asks for a GPU profile (profile/measure_job.py), run here on the CPU: the
    same layers and bytes as measuring in this process, read back through the cache it wrote."""
    monkeypatch.setenv("DAPPLE_CACHE", str(tmp_path / "cache"))
    from hydra import compose, initialize_config_dir

    from dapple_launch.config import CONF_DIR
    from dapple_launch.plan_config import model_from_config
    from dapple_launch.profile.measure import measure_profile
    from dapple_launch.profile.measure_job import measure_elsewhere

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=TINY_GPT)
    there = measure_elsewhere(cfg.model, 2, "cpu", "32")
    here = measure_profile(model_from_config(cfg.model), 2, device="cpu", precision="32")
    assert [layer.name for layer in there.layers] == [layer.name for layer in here.layers]
    assert [layer.activation_bytes for layer in there.layers] == [layer.activation_bytes for layer in here.layers]
    assert [layer.parameter_bytes for layer in there.layers] == [layer.parameter_bytes for layer in here.layers]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a usable GPU: nothing to refuse")
def test_a_measured_profile_for_a_gpu_cluster_without_cuda_is_refused(compose_cfg):
    from dapple_launch.plan_config import profile_from_config, shipped_topology

    cfg = compose_cfg(["cluster=h100x8", "strategy=auto", "strategy.profile_source=measured", *TINY_GPT])
    with pytest.raises(ValueError, match="profile_source=measured times the layers on this machine's GPU"):
        profile_from_config(cfg, shipped_topology("h100x8"))


def test_the_rendezvous_interface_is_the_routes_and_never_loopback_for_a_peer(monkeypatch):
    from dapple_launch.host import rendezvous_interfaces, route_interface

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    assert route_interface("127.0.0.1") == "lo"
    assert rendezvous_interfaces("127.0.0.1") == {}  # everything on this host: gloo's own choice works
    assert rendezvous_interfaces(None) == {}
    assert rendezvous_interfaces("127.0.0.1", "eth7") == {"GLOO_SOCKET_IFNAME": "eth7", "NCCL_SOCKET_IFNAME": "eth7"}
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mine")  # the user's own setting wins
    assert rendezvous_interfaces("127.0.0.1", "eth7")["GLOO_SOCKET_IFNAME"] == "mine"
    import subprocess

    route = subprocess.run(["ip", "-o", "route", "get", "10.213.99.1"], capture_output=True, text=True).stdout.split()
    if "dev" in route:  # a routed address: its interface, whatever this machine calls it
        assert route_interface("10.213.99.1") == route[route.index("dev") + 1]
