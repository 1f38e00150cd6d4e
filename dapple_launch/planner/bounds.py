"""A lower bound the search prunes with: the least bottleneck any completion can reach.

bound[i, d] = the smallest possible max over the remaining stages of (stage time, outgoing
transfer) when layers [i, L) are cut into contiguous stages placed from device d on, exactly as
the search places them (each stage starts at the next free device or at the next node's first
device, and takes an allowed replica count), each within memory (parameters × optimizer factor
plus one micro-batch of activations: the least any schedule keeps). A transfer counts at its
least: this stage's share of the activation over the fastest link the placement allows (the
network when the stage spans nodes or the next stage must start on another node, else NVLink).
The warm-up, the other side's replica count, all-reduces and a stage limit above two are left out, so the
bound never exceeds the bottleneck of a real completion. One dynamic programme per micro-batch
size, vectorised over cut points and device positions; each row computes only the positions a
search can reach it at (no fewer devices than stages within the cap take to hold the layers before
it: _first_starts) and from which the rest has a completion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..cluster import Topology
from ..profile.model_profile import ModelProfile, kept_of
from .allreduce import tied_floor_s
from .in_flight import runs_of_holds
from .recompute_room import recompute_room


@dataclass(frozen=True)
class BoundInputs:
    profile: ModelProfile
    topology: Topology
    micro_batch: int
    num_micro_batches: int
    replica_choices: tuple[int, ...]
    speed: float
    capacity_bytes: float
    optimizer_factor: float
    # A stage slower than this is in no plan that beats the incumbent (T >= M × any stage's time),
    # so the tables leave it out: they bound every plan that could still win, at a fraction of the work.
    stage_time_cap: float = math.inf
    # recomputation may shrink what a micro-batch keeps (strategy.recompute=auto or selective: a stage's recomputed
    # segment and the rest never live at once), so only the parameters bound a stage's memory
    activations_may_shrink: bool = False
    # the most stages a plan may have (1F1B and ZB-H1: no more than micro-batches; 0: no limit).
    # With 1, every table is the last stage's alone; with 2, rows past layer 0 are (a stage is
    # placed before them), and row 0 takes two: exact there, at a fraction of the work (with one or
    # two micro-batches, 512 devices' largest sizes cost most of the planning otherwise).
    stage_limit: int = 0
    # every search that reads these tables cuts a stage slower than stage_time_cap (it searches under
    # an incumbent no slower than theirs): each row then needs only the starts such stages can reach
    # (_first_starts). Not where a faster plan of a family not allowed set the cap (ZB-H1 alone, with
    # a 1F1B baseline the best so far: its pass searches under its own, slower incumbent)
    read_under_cap: bool = False
    # limits.recompute, for the room 1F1B's stages leave micro-batches in flight (links[0]): "none"
    # keeps every activation, "full" each stage's input, "auto" recomputes each stage's first k layers
    # for some k; None (or "selective", whose positions are the user's): no room counted
    recompute: str | None = None


def fresh_node_start(d, devices_per_node: int, devices: int):
    """The next node's first device, where a stage may start fresh instead of at free device d
    (d itself when d already starts a node or lies in the last node). Ints or numpy arrays."""
    k = devices_per_node
    return np.where((d % k != 0) & (d // k != (devices - 1) // k), (d // k + 1) * k, d)


def stage_starts(d: int, devices_per_node: int, devices: int) -> list[int]:
    """Where the next stage may start when device d is the first free one (append or fresh node)."""
    fresh = int(fresh_node_start(d, devices_per_node, devices))
    return [d] if fresh == d else [d, fresh]


def _links(x: BoundInputs, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Per start device s: (latency, bandwidth) of the fastest link out of a stage on [s, s + r)."""
    t, D, k = x.topology, x.topology.num_devices, x.topology.devices_per_node
    s = np.arange(D)
    spans = (s // k) != ((s + r - 1) // k)
    next_elsewhere = ((s + r) % k) == 0  # the next free device is on another node
    slow = spans | next_elsewhere
    fast_bw, fast_lat = t.fastest_p2p_link(False)
    return (np.where(slow, t.inter_node_latency_s, fast_lat), np.where(slow, t.inter_node_bandwidth, fast_bw))


@dataclass(frozen=True)
class SuffixBounds:
    """Lower bounds over every completion of layers [i, L) placed from device d on (arrays [i, d])."""

    bottleneck: np.ndarray  # the least max over its stages of (stage time, outgoing transfer)
    choice: np.ndarray  # [i, d] -> (stop, first device, replicas) of a first stage attaining it
    pass_sum: np.ndarray  # the least sum over its stages of (stage time + 2 × outgoing transfer)
    stage_end: np.ndarray  # the least over completions of max over its stages of when that stage's all-reduce can end
    # Valid for any 1F1B warm-up (warmup.py), where a stage may run ahead and hide the stages after it:
    reach_end: (
        np.ndarray
    )  # least max over p of sum_{j<p}(F_j + c_j) + max(M t_p, t_p + (M-1) max(F_p, B_p) + R_p) + AR_p
    round_end: np.ndarray  # least max over p of sum_{j<p}(t_j + 2 c_j) + max(M t_p, t_p + (M-1) max(F_p, B_p) + R_p)
    # Valid for any schedule, a split backward's included (planner/zero_bubble_search.py):
    compute_end: np.ndarray | None = None  # least max over p of sum_{j<p}(F_j + c_j) + M t_p + AR_p
    # (links[1], compute_end's with the links, counts memory as ZB-H1 keeps it: ZB-H1's alone)
    # reach_end and compute_end with each stage's outgoing link too (suffix_bound: links), for the
    # proof only: the search walks the tables above (these would change the order of its work, and
    # with a budget that ends first, what it finds)
    links: tuple[np.ndarray, np.ndarray] | None = None  # (reach_end's, compute_end's)
    links_choice: np.ndarray | None = None  # [table, i, d] -> (stop, first device, replicas) attaining links[table]
    # links[0] with the room memory leaves 1F1B's micro-batches in flight under the plan's recomputation
    # (BoundInputs.recompute; None where it is not counted): the proof's 1F1B table
    reach_room: np.ndarray | None = None


def suffix_bound(x: BoundInputs) -> SuffixBounds:
    """One backward dynamic programme over first layer i and first free device d: its tables.

    bottleneck: min over completions of max(t_s, c_s) (c_s the least outgoing transfer).
    pass_sum:   min over completions of sum(t_s + 2 c_s): one micro-batch's pass through them.
    stage_end:  stage s of a plan runs M micro-batches and then its all-reduce, after the first
                micro-batch's forward reached it and before the rest's last pass leaves:
                T >= sum_{j<s}(F_j + c_j) + M t_s + 2 c_s + AR_s + sum_{j>s}(t_j + 2 c_j), for
                every s (both schedules). It couples a stage's speed to the all-reduce its
                replicas pay, which the bottleneck table alone cannot see.
    reach_end, round_end: the same without the later stages' pass, which a deeper warm-up can hide:
                stage p starts after the first micro-batch's forward reached it, computes M t_p,
                then all-reduces (reach_end) or sends its last gradient back down (round_end).
                What no warm-up hides is in both: stage p's first backward waits for the
                first micro-batch's round trip R_p = 2 c_p + sum_{j>p}(t_j + 2 c_j), its last
                backward for the last one's, so it needs F_p + R_p + M B_p and M F_p + R_p + B_p
                before its all-reduce (warmup.py's bound with every micro-batch in flight): it
                binds where few micro-batches fill a deep pipeline, or all-reduces are long.
    compute_end: only that stage p starts after the first micro-batch reached it, computes M t_p
                and all-reduces after its last weight gradient: what holds when the backward is
                split (zero bubble), whose input gradients may leave long before the weights'.
    links:      reach_end and compute_end where stage p's outgoing link counts too: it carries the M
                activations one after another, the first after one forward, so the last leaves at
                least F_p + M c_p after the stage's start; that micro-batch's way on and back
                (c_p, and where the backward is whole the rest's pass) and p's backward of it
                follow, whatever the warm-up: t_p + (M + 1) c_p (+ the rest's pass) + AR_p. On a
                slow network it is what binds (GNMT on 16 × 1 V100 at 10 Gbps: the 1F1B and ZB-H1
                bounds 43 % under the plan without it). These count a tied weight's sum after the
                all-reduce of each stage that shares it with a layer outside (allreduce.tied_floor_s:
                GPT large on 16 × 1 V100 at 10 Gbps, its embedding and head tied: 214 ms each).
                And the drain: the micro-batch of stage p's last backward still takes its gradient
                back through layers 0 .. i - 1 (each at least its backward on the fewest samples a
                replica runs), beside the all-reduce: the stage's last backward is followed by the
                greater of the two. Split (compute_end's), what was one backward is two: the last I
                is followed by the drain at the input share (ModelProfile.least_input_share), the
                last W by the all-reduce; and the round trips count: no I or W of p before the first
                micro-batch's gradient is back (F_p + R'_p, then all M of each), the last's after
                M F_p + R'_p and after its way over the link, where R'_p = 2 c_p + the least sum
                of F + I + 2 c over the later stages (input_sum: their W may wait). GNMT-32 on
                16 × 1 V100 at 10 Gbps, G 64, b 1: the ZB-H1 bound 73.9 -> 76.1 ms, 1F1B's 75.2 ->
                78.3 ms (the plan: 93.5 ms).
                compute_end's links table is ZB-H1's alone, and counts its memory: ZB-H1 recomputes
                nothing (cost.evaluate), so stage p keeps each micro-batch from its forward's end to
                its input gradient's, at least R'_p + I_p, and at most `most` at once within its
                devices' memory (weights, workspace, `most` micro-batches' saves): the M holds split
                into `most` runs of disjoint ones (an interval graph's colouring), so the last I is
                no sooner than F_p + ceil(M / most) (R'_p + I_p). Memory-bound models: Llama 3 70B
                on 256 A100s, G 256, the ZB-H1 bound 19.2 -> 36.5 s (the plan: 1F1B, 34.4 s).
    Each table minimises on its own (the least of each is at most what any one completion
    attains), so each is a valid bound.
    """
    p, topo = x.profile, x.topology
    D, L, pbs, k, M = topo.num_devices, p.num_layers, p.batch_size, topo.devices_per_node, x.num_micro_batches
    pre = p._prefix
    # per profile batch: the part that scales with samples, and the part each call costs regardless
    fwd_fixed = np.asarray(pre["ff"])
    call = fwd_fixed + np.asarray(pre["bf"])
    fwd = np.asarray(pre["f"]) - fwd_fixed
    work = np.asarray(pre["f"]) + np.asarray(pre["b"]) - call
    params, kept, kept_fixed = np.asarray(pre["p"]), np.asarray(pre["m"]), np.asarray(pre["mf"])
    cut = np.asarray((0.0, *p.cut_bytes))  # cut[i]: bytes crossing into a stage that starts at layer i
    prefix = (fwd_fixed, fwd, kept, kept_fixed, cut)  # (for recompute_room)
    back = p.least_input_share()
    # drain[i]: the least a gradient takes back through layers 0 .. i - 1 once a stage starting at
    # layer i has run its backward of it (each layer whole, on the fewest samples any replica runs;
    # the sends between them left out): the proof's tables end a stage's last backward with it
    least = math.ceil(x.micro_batch / min(x.micro_batch, D, max(x.replica_choices, default=1)))
    drain = np.concatenate(([0.0], np.cumsum(np.asarray(p.layer_seconds(least)[1]) * x.speed)))
    # each layer's workspace (ModelProfile.workspace): its fixed part and its part per sample
    ws_fixed = np.asarray([min(layer.workspace_fixed_bytes, layer.workspace_bytes) for layer in p.layers])
    ws_slope = (np.asarray([layer.workspace_bytes for layer in p.layers]) - ws_fixed) / pbs
    # Tables have two spare columns: D (no device left: only the end state is finite) and D + 1
    # (always inf), where a stage that would run past the last device points.
    shape = (L + 1, D + 2)
    bound, pass_sum, stage_end, reach_end, round_end, compute_end = (np.full(shape, np.inf) for _ in range(6))
    reach_l, compute_l, input_sum = (np.full(shape, np.inf) for _ in range(3))  # (links)
    # (1F1B's links table with the room for micro-batches in flight: for the proof only, as the
    # placements its argmin would pick differ from reach_l's, which TableStarts starts from)
    reach_r = np.full(shape, np.inf) if x.recompute in ("none", "full", "auto") else None
    tables = (bound, pass_sum, stage_end, reach_end, round_end, compute_end, reach_l, compute_l, input_sum)
    if reach_r is not None:
        tables = (*tables, reach_r)
    for table in tables:
        table[L, : D + 1] = 0.0
    # [i]: the last column finite in any table's row i (-1: none): a stage whose next free device
    # lies past it leaves layers i .. L - 1 no completion
    last_finite = np.full(L + 1, -1)
    last_finite[L] = D
    choice = np.zeros((L + 1, D + 1, 3), dtype=int)
    # (links' choices, as choice is bound's: [table][i, d] -> stop, first device, replicas)
    link_choices = np.zeros((2, L + 1, D + 1, 3), dtype=int)
    starts = np.arange(D)
    # Replica counts in chunks of at most ~64k cells per array: small clusters take every count in
    # one vectorised step, 512 devices one count at a time (same results, ties to the fewest replicas).
    # A row whose stage can only be the last (its one stop is L) takes counts by 64k / D at a time.
    replicas = [r for r in x.replica_choices if r <= D]

    def chunked(per_chunk: int) -> list[tuple]:
        out = []
        for c in range(0, len(replicas), per_chunk):
            R = np.asarray(replicas[c : c + per_chunk])
            nxt = starts[None, :] + R[:, None]  # (R, D): the next free device after the stage
            nxt = np.where(nxt <= D, nxt, D + 1)
            lat, bw = (np.stack(v) for v in zip(*(_links(x, int(r)) for r in R)))
            slope, fixed = (np.stack(v) for v in zip(*(_allreduce_factors(topo, int(r)) for r in R)))
            out.append((c, R, nxt, lat, bw, slope, fixed, np.ceil(x.micro_batch / R)))
        return out

    every_stop = chunked(max(1, 65536 // (L * D)))
    last_stop = chunked(max(1, 65536 // D)) if x.stage_limit in (1, 2) else every_stop
    # (one replica count a chunk: _first_starts holds)
    exact = x.read_under_cap and bool(replicas) and len(every_stop) == len(replicas)
    lowest = _first_starts(x, replicas, call, work, params) if exact else np.zeros(L + 1, dtype=int)
    for i in range(L - 1, -1, -1):
        last_only = x.stage_limit == 1 or (x.stage_limit == 2 and i > 0)
        z_all = np.arange(L, L + 1) if last_only else np.arange(i + 1, L + 1)
        stage_work_all = (work[z_all] - work[i]) * x.speed / pbs  # per sample; nondecreasing in the stop
        stage_fwd_all = (fwd[z_all] - fwd[i]) * x.speed / pbs
        stage_fixed_all = (call[z_all] - call[i]) * x.speed  # per call; nondecreasing in the stop
        stage_fwd_fixed_all = (fwd_fixed[z_all] - fwd_fixed[i]) * x.speed
        stage_param_bytes_all = params[z_all] - params[i]
        stage_params_all = stage_param_bytes_all * x.optimizer_factor
        # what the stage's layers save: each call's fixed part, and the rest (kept_of)
        stage_kept_fixed_all = kept_fixed[z_all] - kept_fixed[i]
        stage_kept_all = kept[z_all] - kept[i]
        sent_all = np.where(z_all < L, cut[np.minimum(z_all, L - 1)] * x.micro_batch / pbs, 0.0)
        # the most workspace one layer of [i, z) holds beside the saves, fixed and per sample
        ws_fixed_all = np.maximum.accumulate(ws_fixed[i:])[z_all - i - 1]
        ws_slope_all = np.maximum.accumulate(ws_slope[i:])[z_all - i - 1]
        # the best completion whose first stage (holding layer i) starts exactly at device s
        best_at = np.full(D, np.inf)
        sum_at, end_at, reach_at, round_at, compute_at = (np.full(D, np.inf) for _ in range(5))
        reach_at_l, compute_at_l, input_at, room_at = (np.full(D, np.inf) for _ in range(4))
        stop_at, replicas_at = np.zeros(D, dtype=int), np.zeros(D, dtype=int)
        link_stop_at, link_replicas_at = np.zeros((2, D), dtype=int), np.zeros((2, D), dtype=int)
        link_at = (reach_at_l, compute_at_l)

        def keep_least(table: int, values: np.ndarray) -> None:
            """link_at[table][a:w] lowered to values' least over (replicas, stop), its choice kept."""
            flat = values.reshape(-1, w - a).argmin(axis=0)
            cand = values.reshape(-1, w - a)[flat, starts[: w - a]]
            better = cand < link_at[table][a:w]
            link_at[table][a:w] = np.where(better, cand, link_at[table][a:w])
            link_stop_at[table, a:w] = np.where(better, z[flat % len(z)], link_stop_at[table, a:w])
            link_replicas_at[table, a:w] = np.where(better, R[flat // len(z)], link_replicas_at[table, a:w])

        # the tied weights' sums (links' tables) of every stop and count at once: one call a row
        tied_all = tied_floor_s(p, i, z_all, np.asarray(replicas), topo) if p.tied else None
        chunks = last_stop if last_only else every_stop
        for c, R, nxt, lat, bw, slope, fixed, n_all in chunks:  # (offset, replicas, stop, start)
            # stops whose stage is too slow even with the chunk's most replicas are left out
            useful = int(np.searchsorted(stage_fixed_all + stage_work_all * n_all[-1], x.stage_time_cap, side="right"))
            if useful == 0:
                continue
            # starts past D - min(R) leave no device for any of the chunk's counts, and starts whose
            # stage ends past every useful stop's last finite column leave the rest no completion:
            # their completions are inf in every table, so only the first w starts are computed (half
            # the cells at 512 devices; of the rest, 12-17 % at 1024, BERT-96 at b 256 and 512)
            w = min(D, int(last_finite[z_all[0] : z_all[0] + useful].max())) - int(R[0]) + 1
            a = int(lowest[i])  # (no search reaches layer i on fewer devices)
            if w <= a:
                continue
            z, n = z_all[:useful], n_all
            ahead = _ahead(int(z[0]), int(z[0]) + useful, R, nxt[:, a:w], a)  # (stops z are consecutive)
            lat, bw, slope, fixed = lat[:, a:w], bw[:, a:w], slope[:, a:w], fixed[:, a:w]
            stage_work, stage_fwd = stage_work_all[:useful], stage_fwd_all[:useful]
            stage_fixed, stage_fwd_fixed = stage_fixed_all[:useful], stage_fwd_fixed_all[:useful]
            stage_param_bytes, stage_params = stage_param_bytes_all[:useful], stage_params_all[:useful]
            stage_kept, sent = stage_kept_all[:useful], sent_all[:useful]
            stage_kept_fixed = stage_kept_fixed_all[:useful]
            stage_ws_fixed, stage_ws_slope = ws_fixed_all[:useful], ws_slope_all[:useful]
            # what a micro-batch of n samples keeps on the stage (ModelProfile.kept_bytes)
            kept_mb = kept_of(stage_kept_fixed[None, :], stage_kept[None, :], cut[i], n[:, None], pbs)
            kept_scale = 0.0 if x.activations_may_shrink else 1.0
            t = np.where(
                stage_params[None, :] + kept_scale * kept_mb > x.capacity_bytes,
                np.inf,
                stage_fixed[None, :] + stage_work[None, :] * n[:, None],
            )[:, :, None]
            link = lat[:, None, :] + (sent[None, :] / R[:, None])[:, :, None] / bw[:, None, :]
            if z[-1] == L:  # (a stage that ends the model sends nothing)
                link = np.where((z < L)[None, :, None], link, 0.0)
            rest = ahead(bound)  # the completion from device s + r on
            value = np.maximum(np.maximum(t, link), rest).reshape(-1, w - a)
            flat = value.argmin(axis=0)
            cand = value[flat, starts[: w - a]]
            better = cand < best_at[a:w]
            best_at[a:w] = np.where(better, cand, best_at[a:w])
            stop_at[a:w] = np.where(better, z[flat % len(z)], stop_at[a:w])
            replicas_at[a:w] = np.where(better, R[flat // len(z)], replicas_at[a:w])
            two_links = 2 * link
            per_pass = t + two_links
            rest_sum = ahead(pass_sum)
            sum_at[a:w] = np.minimum(sum_at[a:w], (per_pass + rest_sum).min(axis=(0, 1)))
            forward = stage_fwd_fixed[None, :, None] + stage_fwd[None, :, None] * n[:, None, None]
            # what is left of the all-reduce after the last backward, whose buckets it may overlap
            # (planner/allreduce.py): at least one all-reduce of every byte less that backward
            ar = np.maximum(
                0.0, stage_param_bytes[None, :, None] * slope[:, None, :] + fixed[:, None, :] - (t - forward)
            )
            if not (stage_param_bytes > 0).all():  # (a stage without weights all-reduces nothing)
                ar = np.where(stage_param_bytes[None, :, None] > 0, ar, 0.0)
            forward_in = forward + link
            end = np.maximum(M * t + two_links + ar + rest_sum, forward_in + ahead(stage_end))
            end_at[a:w] = np.minimum(end_at[a:w], end.min(axis=(0, 1)))
            slow_side = (M - 1) * np.maximum(forward, t - forward) if M > 1 else 0.0  # (0 × inf is nan)
            # the first micro-batch's round trip and the rest's steps, before the last backward leaves
            trip = np.maximum(M * t, t + slow_side + two_links + rest_sum)
            reach = np.maximum(trip + ar, forward_in + ahead(reach_end))
            reach_at[a:w] = np.minimum(reach_at[a:w], reach.min(axis=(0, 1)))
            round_trip = np.maximum(trip, per_pass + ahead(round_end))
            round_at[a:w] = np.minimum(round_at[a:w], round_trip.min(axis=(0, 1)))
            computed = np.maximum(M * t + ar, forward_in + ahead(compute_end))
            compute_at[a:w] = np.minimum(compute_at[a:w], computed.min(axis=(0, 1)))
            # with the stage's outgoing link and the drain (the docstring's links)
            sends = t + (M + 1) * link
            # and, for the proof only too, a weight the stage shares with a layer outside it: summed
            # after its own all-reduce (allreduce.tied_floor_s)
            if tied_all is not None:
                ar = ar + tied_all[:useful, c : c + len(R)].T[:, :, None]
            own = np.maximum(trip, sends + rest_sum) + np.maximum(ar, drain[i])
            keep_least(0, np.maximum(own, forward_in + ahead(reach_l)))
            # what the device's memory leaves micro-batches beside the weights and one layer's workspace
            room = (
                x.capacity_bytes
                - stage_params[None, :]
                - (stage_ws_fixed[None, :] + stage_ws_slope[None, :] * n[:, None])
            )
            if reach_r is not None:  # the same with the room for micro-batches in flight (recompute_room)
                # a micro-batch's hold, in its parts: its way on, the later stages' passes and back,
                # this stage's backward (summed at the cells recompute_room raises: most are not)
                hold = (two_links, rest_sum, t - forward)
                roomy = recompute_room(
                    str(x.recompute),  # (one of none, full, auto: reach_r is built)
                    M,
                    x.speed,
                    pbs,
                    prefix,
                    i,
                    z,
                    n,
                    t,
                    forward,
                    hold,
                    ar,
                    float(drain[i]),
                    room,
                    kept_mb,
                    np.maximum(own, forward_in + ahead(reach_r)),
                    room_at[a:w],
                )
                room_at[a:w] = np.minimum(room_at[a:w], roomy.reshape(-1, w - a).min(axis=0))
            # a split backward: the rest's pass counts each later stage's input gradient only (its
            # W may wait), and the stage's own last W is followed by the all-reduce, its last I by
            # the drain (at the input share: the first stage's backward is all W, no less)
            backward = t - forward  # (these (replicas, stop, 1): the full arrays are the links')
            with np.errstate(invalid="ignore"):  # (a stage over memory: inf, not 0 × inf)
                input_ = np.where(np.isfinite(backward), back * backward, np.inf)
            way = two_links + ahead(input_sum)  # the first (and the last) micro-batch's round trip from here
            input_at[a:w] = np.minimum(input_at[a:w], ((forward + input_) + way).min(axis=(0, 1)))
            # the first micro-batch's gradient is back after its forward here and its round trip; the
            # last's after all M forwards here, or its activation's way over the link, then its trip
            first = forward + way
            last = way + np.maximum(M * forward, forward + (M - 1) * link)
            last_w = np.maximum(np.maximum(M * t, first + M * backward), last + backward)
            last_i = np.maximum(np.maximum(M * (forward + input_), first + M * input_), last + input_)
            # and the room to keep micro-batches (ZB-H1 recomputes none: cost.evaluate): a stage keeps
            # each from its forward's end to its input gradient's, the way there and back at least,
            # and at most `most` at once within memory; they split into `most` runs of disjoint
            # holds (copies_bound.CopiesBound._in_flight), one of M / most after the first forward
            runs = runs_of_holds(room, kept_mb, M)[:, :, None]
            if np.isfinite(runs).all():
                held = forward + runs * (way + input_)
            else:
                with np.errstate(invalid="ignore"):  # (inf where none fits, not inf × 0)
                    held = np.where(np.isfinite(runs), forward + runs * (way + input_), np.inf)
            last_i = np.maximum(last_i, held)
            computed = np.maximum(np.maximum(last_w + ar, last_i + back * drain[i]), forward_in + ahead(compute_l))
            keep_least(1, computed)
        fresh = fresh_node_start(starts, k, D)
        s = np.where(best_at[fresh] < best_at, fresh, starts)  # ties: continue on the same node
        bound[i, :D] = best_at[s]
        choice[i, :D] = np.stack([stop_at[s], s, replicas_at[s]], axis=1)
        pass_sum[i, :D] = np.minimum(sum_at, sum_at[fresh])
        stage_end[i, :D] = np.minimum(end_at, end_at[fresh])
        reach_end[i, :D] = np.minimum(reach_at, reach_at[fresh])
        round_end[i, :D] = np.minimum(round_at, round_at[fresh])
        compute_end[i, :D] = np.minimum(compute_at, compute_at[fresh])
        for table, (out, at) in enumerate(zip((reach_l, compute_l), link_at)):
            s = np.where(at[fresh] < at, fresh, starts)
            out[i, :D] = at[s]
            link_choices[table, i, :D] = np.stack([link_stop_at[table][s], s, link_replicas_at[table][s]], axis=1)
        input_sum[i, :D] = np.minimum(input_at, input_at[fresh])
        if reach_r is not None:
            reach_r[i, :D] = np.minimum(room_at, room_at[fresh])
        finite = np.isfinite(bound[i, :D])  # (the row's cells once, not a search of each table)
        for table in tables[1:]:
            finite |= np.isfinite(table[i, :D])
        last_finite[i] = _last_finite(finite)
    return SuffixBounds(
        bound,
        choice,
        pass_sum,
        stage_end,
        reach_end,
        round_end,
        compute_end,
        (reach_l, compute_l),
        link_choices,
        reach_r,
    )


def _first_starts(x: BoundInputs, replicas: list[int], call, work, params) -> np.ndarray:
    """[i]: the fewest devices any stages holding layers 0 .. i - 1 take, each within memory (its
    parameters alone) and no slower than the stage time cap (a hair above it): no search reaches
    layer i at an earlier free device, so the tables start row i's stages there. Exact where each
    chunk is one replica count (a stage over the cap is then in no table): every cell from there on
    reads only cells from there on, so the tables agree with the full ones wherever they are read."""
    p, L = x.profile, x.profile.num_layers
    cap = x.stage_time_cap * (1 + 1e-9)
    R = np.asarray(replicas)
    n = np.ceil(x.micro_batch / R)[:, None]
    fewest = np.full(L + 1, np.inf)
    fewest[0] = 0.0
    for j in range(L):
        z = np.arange(j + 1, L + 1)
        t = (call[z] - call[j]) * x.speed + (work[z] - work[j]) * x.speed / p.batch_size * n  # (R, stops)
        fits = (t <= cap) & ((params[z] - params[j]) * x.optimizer_factor <= x.capacity_bytes)[None, :]
        least = np.where(fits, R[:, None], np.inf).min(axis=0)  # each stop's fewest replicas
        fewest[j + 1 :] = np.minimum(fewest[j + 1 :], fewest[j] + least)
    return np.where(np.isfinite(fewest), np.minimum(fewest, x.topology.num_devices), x.topology.num_devices).astype(int)


def _last_finite(finite: np.ndarray) -> int:
    """The last index where `finite` holds, -1 where it holds nowhere."""
    at = np.flatnonzero(finite)
    return int(at[-1]) if at.size else -1


def _ahead(lo: int, hi: int, R: np.ndarray, nxt: np.ndarray, first: int):
    """table -> table[z, nxt[r, s]] laid out (replicas, stop, start) for stops z in [lo, hi) and the
    starts nxt covers (first, first + 1, ...): the completion after a stage of R[r] replicas starting
    at device s. One replica count (512 devices take them one at a time) is a shifted slice: a view,
    not a gather."""
    if len(R) > 1:
        return lambda table: table[lo:hi][:, nxt].transpose(1, 0, 2)
    r, w = int(R[0]), nxt.shape[1]  # starts first .. first + w - 1: device s + r is free (at most D)

    def shifted(table):
        return table[lo:hi, first + r : first + r + w][None]  # a view: read only

    return shifted


def _allreduce_factors(t: Topology, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Per start device s: (seconds per byte, fixed seconds) of a ring all-reduce over [s, s + r),
    as Topology.allreduce_s (the network's figures when the range spans nodes)."""
    D, k = t.num_devices, t.devices_per_node
    if r <= 1:
        return np.zeros(D), np.zeros(D)
    s = np.arange(D)
    spans = (s // k) != ((s + r - 1) // k)
    (inter_bw, inter_lat), (intra_bw, intra_lat) = t.allreduce_link(True), t.allreduce_link(False)
    bw, lat = np.where(spans, inter_bw, intra_bw), np.where(spans, inter_lat, intra_lat)
    return 2 * (r - 1) / r / bw, 2 * (r - 1) * lat


def least_bottleneck_stages(x: SuffixBounds) -> list[tuple[int, int, int, int]] | None:
    """The placement attaining bound[0, 0]: [(first layer, stop, first device, replicas)], or None.
    A strong first incumbent for the search (it is then costed in full)."""
    return _placement(x.bottleneck, x.choice)


def least_link_stages(x: SuffixBounds, table: int) -> list[tuple[int, int, int, int]] | None:
    """The placement attaining the proof's table `table` at the root (links: 0 1F1B's, 1 ZB-H1's and
    any schedule's): the least of a stage's fill, its M steps or its link's, its round trips, its
    drain and its all-reduce together, where the bottleneck alone is blind to what a stage's replicas
    cost (their all-reduce) and what its cuts cost. Another start for the search."""
    if x.links is None or x.links_choice is None:
        return None
    return _placement(x.links[table], x.links_choice[table])


def _placement(table: np.ndarray, choice: np.ndarray) -> list[tuple[int, int, int, int]] | None:
    if not math.isfinite(table[0, 0]):
        return None
    L = table.shape[0] - 1
    stages, i, d = [], 0, 0
    while i < L:
        stop, s, r = (int(v) for v in choice[i, d])
        if stop <= i:  # (no choice kept there: a table whose value was never reached)
            return None
        stages.append((i, stop, s, r))
        i, d = stop, s + r
    return stages
