"""Topology: the cluster as plain data, read from conf/cluster/*.yaml.

Device id = node × devices_per_node + local index. Links inside a node (NVLink) are much faster
than between nodes; the slowest link a transfer or an all-reduce touches sets its speed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    import numpy as np

GB = 1e9


@dataclass(frozen=True)
class Topology:
    name: str
    nodes: int
    devices_per_node: int
    device_memory_bytes: float
    device_tflops: float  # sustained training throughput of one device, used by analytic profiles
    intra_node_bandwidth: float  # bytes/s, point to point
    inter_node_bandwidth: float  # bytes/s, point to point
    intra_node_latency_s: float = 5e-6
    inter_node_latency_s: float = 20e-6
    intra_node_allreduce_bandwidth: float | None = None  # bytes/s ring bus bandwidth; default p2p
    inter_node_allreduce_bandwidth: float | None = None
    device_kind: str = "gpu"  # "gpu" or "cpu"
    intra_node_allreduce_latency_s: float | None = None  # per ring step; default the link's latency
    inter_node_allreduce_latency_s: float | None = None
    # the runtime's own time per compute action, beyond the profile's layers and the links: what a
    # CPU process pays in Python and scheduling per action (StageCosts.action_s); ~0 on a GPU, whose
    # kernels run ahead of the Python that launches them
    action_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.devices_per_node < 1:
            raise ValueError(
                f"cluster {self.name!r} has {self.nodes} nodes × {self.devices_per_node} devices per node = "
                f"{self.nodes * self.devices_per_node} devices; a cluster needs at least one of each "
                f"(set cluster.nodes and cluster.devices_per_node >= 1)"
            )
        for key in ("device_memory_bytes", "device_tflops", "intra_node_bandwidth", "inter_node_bandwidth"):
            if getattr(self, key) <= 0:
                raise ValueError(f"cluster {self.name!r}: {key} must be > 0, got {getattr(self, key)}")
        if not self.action_overhead_s >= 0:
            raise ValueError(f"cluster {self.name!r}: action_overhead_s must be >= 0, got {self.action_overhead_s}")

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    def node_of(self, device: int) -> int:
        return device // self.devices_per_node

    def spans_nodes(self, devices: Iterable[int]) -> bool:
        # the lowest and highest device ids are on different nodes exactly when any two are
        devices = tuple(devices)
        return bool(devices) and min(devices) // self.devices_per_node != max(devices) // self.devices_per_node

    def p2p(self, src: Iterable[int], dst: Iterable[int]) -> tuple[float, float]:
        """(bandwidth, latency) of the slowest link between two device sets."""
        if self.spans_nodes([*src, *dst]):
            return self.inter_node_bandwidth, self.inter_node_latency_s
        return self.intra_node_bandwidth, self.intra_node_latency_s

    def allreduce_s(self, devices: tuple[int, ...], nbytes: float) -> float:
        """Ring all-reduce time over the slowest link of `devices`."""
        r = len(devices)
        if r <= 1 or nbytes <= 0:
            return 0.0
        return ring_allreduce_s(r, nbytes, self.allreduce_link(self.spans_nodes(devices)))

    def fastest_p2p_link(self, must_span: bool) -> tuple[float, float]:
        """(bandwidth, latency) of the fastest link two device sets may share: the network's where
        they must span nodes, else the faster of the node's and the network's (a pair that fits one
        node may still sit across two; p2p takes the network's for any pair across nodes). What a
        lower bound prices an unplaced transfer on."""
        if must_span:
            return self.inter_node_bandwidth, self.inter_node_latency_s
        return (
            max(self.intra_node_bandwidth, self.inter_node_bandwidth),
            min(self.intra_node_latency_s, self.inter_node_latency_s),
        )

    def fastest_allreduce_link(self, must_span: bool) -> tuple[float, float]:
        """The fastest all-reduce link a group may get: the network's where it must span nodes (more
        devices than a node), else the faster of the node's and the network's (a group that fits
        one node may still sit across two). What a lower bound prices an unplaced group on."""
        (inter_bw, inter_lat), (intra_bw, intra_lat) = self.allreduce_link(True), self.allreduce_link(False)
        if must_span:
            return inter_bw, inter_lat
        return max(inter_bw, intra_bw), min(inter_lat, intra_lat)

    def allreduce_link(self, across_nodes: bool) -> tuple[float, float]:
        """(bus bandwidth, latency per ring step) of an all-reduce inside a node or across nodes."""
        if across_nodes:
            return (
                self.inter_node_allreduce_bandwidth or self.inter_node_bandwidth,
                self.inter_node_allreduce_latency_s or self.inter_node_latency_s,
            )
        return (
            self.intra_node_allreduce_bandwidth or self.intra_node_bandwidth,
            self.intra_node_allreduce_latency_s or self.intra_node_latency_s,
        )


@overload
def ring_allreduce_s(replicas: int, nbytes: float, link: tuple[float, float]) -> float: ...
@overload
def ring_allreduce_s(
    replicas: int | np.ndarray[Any, Any],
    nbytes: float | np.ndarray[Any, Any],
    link: tuple[float | np.ndarray[Any, Any], float | np.ndarray[Any, Any]],
) -> np.ndarray[Any, Any]: ...
def ring_allreduce_s(replicas, nbytes, link):
    """A ring all-reduce of `nbytes` over `replicas` devices on `link` (Topology.allreduce_link's
    bus bandwidth and latency per step): each byte crosses 2 (r - 1) / r times, in 2 (r - 1) steps.
    Numbers, or numpy arrays that broadcast (the planner's bounds price many at once)."""
    bw, lat = link
    return 2 * (replicas - 1) / replicas * nbytes / bw + 2 * (replicas - 1) * lat
