"""This machine as local processes see it: the cores they may use, the torch threads each local rank
gets, a rendezvous store for the ranks. Shared by the local launcher, the link and action-cost probes
and the measuring profiler, so they all see the ranks' view; and whether torch here reaches a GPU.
Standard library at import (torch only inside the functions that need it, when asked), so the pure
packages may use it."""

from __future__ import annotations

import os
import socket


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which a container or Slurm may narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def threads_per_rank(ranks: int, cores: int | None = None) -> int:
    """The torch threads each of `ranks` local processes gets: the cores shared out, at least one.
    The measuring profiler and the link probe use the same figure, so they see the ranks' view."""
    return max(1, (cores or usable_cores()) // ranks)


def host_rendezvous(address: str = "127.0.0.1") -> tuple[object, dict[str, str]]:
    """A rendezvous store this process hosts for ranks it starts, and the environment that points
    their `init_process_group` (env://) at it: (store, env). Keep the store alive while they run.

    The store listens on a port the kernel picks and holds from this moment, so no other process
    can take it in between. Picking a free port and letting rank 0 bind it seconds later (after its
    imports) loses that port, now and then, to another launch or to any connection's ephemeral port
    on a busy machine (EADDRINUSE at step 0). Every rank joins as a client, as under torchrun's agent
    (TORCHELASTIC_USE_AGENT_STORE)."""
    from torch.distributed import TCPStore

    store = TCPStore(address, 0, is_master=True, wait_for_workers=False)
    return store, {"MASTER_ADDR": address, "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}


def cuda_missing() -> str | None:
    """Why this process cannot use a CUDA GPU, or None when it can."""
    import torch

    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable GPU{shown}: no GPU here, or a driver older than the build"
    return None


def bf16_missing() -> str | None:
    """Why this process's GPU cannot run bf16, or None when it can."""
    import torch

    if torch.cuda.is_bf16_supported():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"{torch.cuda.get_device_name()} (compute capability {major}.{minor}) has no bf16"


def route_interface(address: str) -> str | None:
    """The network interface this host reaches `address` through (`ip route get`), or None when it
    cannot tell (no iproute2, an unresolvable name)."""
    import subprocess

    try:
        ip = socket.gethostbyname(address)
        out = subprocess.run(["ip", "-o", "route", "get", ip], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    words = out.split()
    dev = words[words.index("dev") + 1] if "dev" in words[:-1] else None
    if dev == "lo" and not ip.startswith("127."):
        # the rendezvous is this host's own address (the route goes through lo): the interface holding it
        try:
            held = subprocess.run(
                ["ip", "-o", "addr", "show", "to", ip], capture_output=True, text=True, timeout=5
            ).stdout.split()
        except (OSError, subprocess.SubprocessError):
            return dev
        return held[1] if len(held) > 1 else dev
    return dev


def rendezvous_interfaces(master_addr: str | None, given: str | None = None) -> dict[str, str]:
    """GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME for a rank whose rendezvous is `master_addr`: the
    interface `given` (cluster.network_interface), else the one the route to the rendezvous takes.
    gloo otherwise binds to what the host's own name resolves to, which on many hosts is a loopback
    address: a peer on another node then never connects. Nothing for a rendezvous on this host
    alone (loopback), nothing that the user already set."""
    name = given or (route_interface(master_addr) if master_addr else None)
    if not name or (name == "lo" and not given):
        return {}
    return {k: os.environ.get(k, name) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}


def check_gpu_here(precision: str, devices_per_node: int | None = None) -> None:
    """Refuse a GPU run this process cannot run as asked (ValueError, one line)."""
    missing = cuda_missing()
    if missing:
        raise ValueError(
            f"cluster.device_kind=gpu but {missing}: nothing would run on a GPU; run where the GPUs are "
            f"(launcher=slurm submits to them), install a CUDA build of torch, or set "
            f"cluster.device_kind=cpu to train on CPU processes here"
        )
    import torch

    visible = torch.cuda.device_count()
    if devices_per_node is not None and devices_per_node > visible:
        raise ValueError(
            f"the plan uses {devices_per_node} GPUs on this node but it shows {visible}; set "
            f"cluster.devices_per_node={visible} and re-plan"
        )
    if precision == "bf16-mixed":
        why = bf16_missing()
        if why:
            raise ValueError(
                f"trainer.precision=bf16-mixed but {why}: use trainer.precision=16-mixed (fp16 with a loss scale) or 32"
            )
