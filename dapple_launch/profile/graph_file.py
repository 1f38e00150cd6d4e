"""Reader for PipeDream/DAPPLE graph text profiles (see profiles/README.md).

  nodeK -- NAME -- forward_compute_time=F, backward_compute_time=B, activation_size=A, parameter_size=P
      nodeX -- nodeY        (indented: X's output feeds Y)

Times are milliseconds per profile batch; sizes are bytes (a list `[a; b]` sums). Nodes are
sorted topologically, keeping file order wherever the edges allow.
"""

from __future__ import annotations

import heapq
import math
import re
from pathlib import Path

from .model_profile import LayerProfile, ModelProfile

_NODE = re.compile(r"^(node\w+) -- (.*) -- (forward_compute_time=.*)$")
_EDGE = re.compile(r"^\s+(node\w+) -- (node\w+)\s*$")
_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")


class ProfileFileError(ValueError):
    pass


def _number(text: str, where: str) -> float:
    text = text.strip()
    if text.startswith("[") and text.endswith("]"):
        return sum(_number(x, where) for x in text[1:-1].split(";") if x.strip())
    try:
        value = float(text)
    except ValueError:
        raise ProfileFileError(f"{where}: {text!r} is not a number") from None
    if not math.isfinite(value):  # a time or size the planner cannot add up
        raise ProfileFileError(f"{where}: {text!r} is not a finite number; give the measured value")
    if value < 0:
        raise ProfileFileError(f"{where}: negative value {value}")
    return value


def parse_graph_text(text: str, name: str, batch_size: int, source: str = "") -> ModelProfile:
    where0 = source or name
    nodes: dict[str, tuple[int, str, dict]] = {}
    edges: list[tuple[str, str, int]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{where0}:{lineno}"
        if m := _EDGE.match(line):
            edges.append((m.group(1), m.group(2), lineno))
            continue
        m = _NODE.match(line)
        if not m:
            raise ProfileFileError(
                f"{where}: expected 'nodeK -- NAME -- forward_compute_time=..., ...' "
                f"or an indented 'nodeX -- nodeY' edge, got {line[:80]!r}"
            )
        node_id, desc, rest = m.groups()
        fields = {}
        for part in re.split(r",\s*(?=\w+=)", rest):
            key, _, value = part.partition("=")
            fields[key.strip()] = _number(value, f"{where} {key.strip()}")
        missing = [f for f in _FIELDS if f not in fields]
        if missing:
            raise ProfileFileError(f"{where}: node {node_id} lacks {missing}")
        if node_id in nodes:
            raise ProfileFileError(f"{where}: node {node_id} defined twice (first on line {nodes[node_id][0]})")
        nodes[node_id] = (lineno, desc.strip(), fields)
    if not nodes:
        raise ProfileFileError(f"{where0}: the profile has no nodes")
    order = list(nodes)
    index = {n: i for i, n in enumerate(order)}
    preds: list[set[int]] = [set() for _ in order]
    succs: list[set[int]] = [set() for _ in order]
    for a, b, lineno in edges:
        for n in (a, b):
            if n not in nodes:
                raise ProfileFileError(f"{where0}:{lineno}: edge names unknown node {n}")
        preds[index[b]].add(index[a])
        succs[index[a]].add(index[b])
    # Kahn's algorithm with file position as priority: a stable topological sort.
    indeg = [len(p) for p in preds]
    ready = [i for i, d in enumerate(indeg) if d == 0]
    heapq.heapify(ready)
    topo: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        topo.append(i)
        for j in sorted(succs[i]):
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(topo) != len(order):
        stuck = [order[i] for i, d in enumerate(indeg) if d > 0]
        first = min(nodes[n][0] for n in stuck)
        raise ProfileFileError(f"{where0}:{first}: the graph has a cycle through {', '.join(stuck[:6])}")
    position = {old: new for new, old in enumerate(topo)}
    layers = []
    for old in topo:
        node_id = order[old]
        _, desc, f = nodes[node_id]
        layers.append(
            LayerProfile(
                name=node_id,
                forward_s=f["forward_compute_time"] / 1e3,
                backward_s=f["backward_compute_time"] / 1e3,
                activation_bytes=f["activation_size"],
                parameter_bytes=f["parameter_size"],
                inputs=tuple(sorted(position[p] for p in preds[old])),
                description=desc,
            )
        )
    try:
        return ModelProfile(name=name, layers=tuple(layers), batch_size=batch_size, source=f"file:{where0}")
    except ValueError as e:  # a rule every profile keeps (ModelProfile's), said of this file
        raise ProfileFileError(f"{where0}: {e}") from None


def read_profile_file(
    path: str | Path, batch_size: int, name: str | None = None, device: str = "", device_tflops: float | None = None
) -> ModelProfile:
    path = Path(path)
    if not path.is_file():
        raise ProfileFileError(f"profile file {path} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ProfileFileError(
            f"profile file {path}: byte {e.object[e.start]:#04x} at offset {e.start} is not UTF-8 text; "
            "a profile is the text PipeDream/DAPPLE's profiler writes, one "
            "'nodeN -- NAME -- forward_compute_time=..., ...' line per layer"
        ) from None
    p = parse_graph_text(text, name or path.stem, batch_size, source=str(path))
    return ModelProfile(
        name=p.name,
        layers=p.layers,
        batch_size=p.batch_size,
        source=p.source,
        device=device,
        device_tflops=device_tflops,
    )
