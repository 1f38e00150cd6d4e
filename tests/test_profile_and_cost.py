"""Pure tier: profile files, analytic profiles, the cost model and fixed plans."""

from __future__ import annotations

import json
import time
import types
from pathlib import Path

import pytest
import torch

from dapple_launch.cluster import Topology
from dapple_launch.models import LayerSpec, PipelineModel, build_model
from dapple_launch.planner import Limits, Plan, fixed_plan
from dapple_launch.planner.cost import StageSpec, evaluate
from dapple_launch.planner.score import simulate_costed
from dapple_launch.profile import (
    LayerProfile,
    ModelProfile,
    ProfileFileError,
    analytic_profile,
    chain,
    parse_graph_text,
    read_profile_file,
)

PROFILES = Path(__file__).resolve().parent.parent / "dapple_launch" / "profiles"
V100X16 = Topology("v100x16", 2, 8, 16 * 2**30, 125, 25e9, 1e9, inter_node_allreduce_bandwidth=3e9)
SHIPPED = [
    ("bert-48-pbs-2.txt", 2),
    ("vgg-19-pbs-32.txt", 32),
    ("amoeba-36-pbs-1.txt", 1),
    ("gnmt-32-pbs-64-simplified.txt", 64),
]


@pytest.mark.parametrize("name,pbs", SHIPPED)
def test_shipped_profiles_parse_in_topological_order(name, pbs):
    p = read_profile_file(PROFILES / name, pbs)
    for j, layer in enumerate(p.layers):
        assert all(i < j for i in layer.inputs), f"{layer.name} consumes a later layer"
    assert all(c >= 0 for c in p.cut_bytes)


def test_gnmt_back_edge_is_sorted():
    p = read_profile_file(PROFILES / "gnmt-32-pbs-64-simplified.txt", 64)
    names = [layer.name for layer in p.layers]
    text = (PROFILES / "gnmt-32-pbs-64-simplified.txt").read_text()
    file_order = [line.split(" -- ")[0] for line in text.splitlines() if line.startswith("node")]
    assert names != file_order and sorted(names) == sorted(file_order)


def test_cut_carries_skip_edges():
    text = (
        "node1 -- a -- forward_compute_time=1, backward_compute_time=1, activation_size=10, parameter_size=0\n"
        "node2 -- b -- forward_compute_time=1, backward_compute_time=1, activation_size=[20; 5], parameter_size=4\n"
        "node3 -- c -- forward_compute_time=1, backward_compute_time=1, activation_size=40, parameter_size=0\n"
        "\tnode1 -- node2\n\tnode2 -- node3\n\tnode1 -- node3\n"
    )
    p = parse_graph_text(text, "skip", 1)
    assert p.cut_bytes == (10.0, 25.0 + 10.0)  # after b, both a's and b's outputs feed c


@pytest.mark.parametrize(
    "text,reason",
    [
        ("", "no nodes"),
        (
            "node1 -- a -- forward_compute_time=x, backward_compute_time=1, activation_size=1, parameter_size=0",
            "not a number",
        ),
        ("garbage line", "expected 'nodeK"),
        (
            "node1 -- a -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0\n"
            "node2 -- b -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=0\n"
            "\tnode1 -- node2\n\tnode2 -- node1",
            "cycle",
        ),
        ("node1 -- a -- forward_compute_time=1, backward_compute_time=1, activation_size=1\n", "lacks"),
        (
            "node1 -- a -- forward_compute_time=nan, backward_compute_time=1, activation_size=1, parameter_size=0",
            "'nan' is not a finite number",
        ),
        (
            "node1 -- a -- forward_compute_time=1, backward_compute_time=1, activation_size=inf, parameter_size=0",
            "'inf' is not a finite number",
        ),
        (
            "node1 -- a -- forward_compute_time=0, backward_compute_time=0.0, activation_size=1, parameter_size=0\n"
            "node2 -- b -- forward_compute_time=0, backward_compute_time=0, activation_size=1, parameter_size=8\n",
            "profile 'bad': all 2 layers have forward and backward time 0; give each layer its measured time "
            r"\(forward_compute_time, backward_compute_time\)",
        ),
    ],
)
def test_bad_profile_files_name_line_and_reason(text, reason):
    with pytest.raises(ProfileFileError, match=reason) as e:
        parse_graph_text(text, "bad", 1, source="bad.txt")
    assert "bad.txt" in str(e.value)


def test_a_profile_file_of_bad_bytes_is_named_with_the_offset_and_what_a_profile_is(tmp_path):
    bad = tmp_path / "model-pbs-4.txt"
    bad.write_bytes(b"node1 -- a -- forward_compute_time=1\xff")
    with pytest.raises(
        ProfileFileError,
        match=r"model-pbs-4.txt: byte 0xff at offset 36 is not UTF-8 text; "
        r"a profile is the text",
    ):
        read_profile_file(bad, 4)


def test_a_damaged_cache_entry_is_measured_again_and_overwritten_not_fatal(tmp_path, monkeypatch):
    """The cache only saves measuring again: an entry cut short, of bad bytes or of another version's
    fields is measured again (with a warning) and replaced, for every reader of the cache."""
    import logging

    import numpy as np

    from dapple_launch.cache import cache_dir
    from dapple_launch.data.files import max_token
    from dapple_launch.log import get_logger
    from dapple_launch.profile import measure_profile

    monkeypatch.setenv("DAPPLE_CACHE", str(tmp_path / "cache"))
    lines: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())
    get_logger().addHandler(handler)
    try:
        first = measure_profile(_BusyModel(), 2, repeats=1)
        (entry,) = [f for f in cache_dir().glob("*.json")]
        for damage in (entry.read_bytes()[:40], b"\xff\xfe" + entry.read_bytes(), b'{"name": "busy"}'):
            entry.write_bytes(damage)
            again = measure_profile(_BusyModel(), 2, repeats=1)
            assert again.num_layers == first.num_layers and ModelProfile.from_json(entry.read_text()) == again
            assert any(str(entry) in x and "measuring again" in x for x in lines), lines
            lines.clear()
        tokens = tmp_path / "tokens.bin"
        np.arange(300, dtype=np.uint16).tofile(tokens)
        stream = np.fromfile(tokens, dtype=np.uint16)
        assert max_token(stream, tokens) == 299
        (key,) = (cache_dir().parent / "data").glob("max-token-*.json")
        key.write_text('{"max": ')
        assert max_token(stream, tokens) == 299 and json.loads(key.read_text()) == {"max": 299}
        assert any("measuring again" in x for x in lines), lines
    finally:
        get_logger().removeHandler(handler)


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_analytic_profile_counts_real_parameters():
    model = build_model("bert", "48")
    p = analytic_profile(model, 2, 125, "v100")
    # Every encoder layer of BERT-48 holds 12.6 M fp32 parameters: DAPPLE's file says the same bytes.
    assert p.layers[1].parameter_bytes == 50384896
    assert p.layers[1].saved_bytes > p.layers[1].activation_bytes


@pytest.mark.slow  # (over a second: out of the fast tier)
@pytest.mark.parametrize(
    "family, preset, precision",
    [("gpt", "tiny", "32"), ("llama", "tiny", "bf16-mixed"), ("bert", "base", "16-mixed"), ("vgg19", "tiny", "32")],
)
def test_the_analytic_trace_of_layers_alike_is_the_trace_of_each(family, preset, precision):
    """trace_layers traces each kind of layer once (class, parameter shapes, input shapes and
    dtypes) and gives the others its figures: the same figures as tracing every layer, for
    decoders and encoders in full and mixed precision, and a network of unlike layers."""
    from dapple_launch.profile.analytic import trace_layers

    model = build_model(family, preset)
    each = list(trace_layers(model, 2, precision, alike=False))
    assert list(trace_layers(model, 2, precision)) == each
    assert len({figures[1:] for figures in each}) < len(each) or family == "vgg19"


def test_profile_json_round_trip():
    p = read_profile_file(PROFILES / "vgg-19-pbs-32.txt", 32)
    assert ModelProfile.from_json(p.to_json()) == p


@pytest.mark.parametrize("name,pbs", SHIPPED)
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb_h1"])
def test_a_candidates_time_is_the_full_simulators(name, pbs, schedule):
    """The planner's time of a candidate (cost.evaluate: encoded compute orders, communication
    implied) equals the simulator of the schedule it would run, communication actions and all."""
    p = read_profile_file(PROFILES / name, pbs, device_tflops=125)
    L = p.num_layers
    for layout in [
        (StageSpec(0, L // 2, tuple(range(8))), StageSpec(L // 2, L, tuple(range(8, 16)))),
        tuple(
            StageSpec(a, b, (d,))
            for d, (a, b) in enumerate(zip(range(0, L, L // 4), [*range(L // 4, L, L // 4)][:3] + [L]))
        ),
    ]:
        c = evaluate(p, V100X16, layout, 16, 8, Limits(schedule=schedule))
        assert c.iteration_s == pytest.approx(simulate_costed(c).iteration_s, rel=1e-12), c.summary()


def test_plan_round_trips_json_and_yaml():
    p = read_profile_file(PROFILES / "bert-48-pbs-2.txt", 2)
    plan = fixed_plan(p, V100X16, 128, 2, [8], 16, Limits())
    assert Plan.from_json(plan.to_json()) == plan
    assert Plan.from_yaml(plan.to_yaml()) == plan
    d = plan.to_dict()
    assert d["stages"][0]["layer_names"][0] == "node1"
    assert d["micro_batch_size"] * d["num_micro_batches"] == d["global_batch_size"]
    assert set(d["estimate"]) >= {"iteration_s", "samples_per_s", "peak_memory_bytes", "speedup_over_data_parallel"}


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(num_stages=2, replicas=[3], num_micro_batches=4), "uses 6 devices but cluster"),
        (dict(num_stages=60, replicas=[1], num_micro_batches=60), "only 53 layers"),
        (dict(num_stages=2, replicas=[8], num_micro_batches=5), "not divisible"),
        (dict(num_stages=2, replicas=[8], num_micro_batches=32), "cannot be split across 8 replicas"),
        (dict(num_stages=16, replicas=[1], num_micro_batches=8), "needs at least 16 micro-batches"),
    ],
)
def test_fixed_plan_bad_input(kwargs, message):
    p = read_profile_file(PROFILES / "bert-48-pbs-2.txt", 2)
    with pytest.raises(ValueError, match=message):
        fixed_plan(p, V100X16, 128, limits=Limits(), **kwargs)


def test_fixed_plan_that_does_not_fit_memory():
    p = read_profile_file(PROFILES / "bert-48-pbs-2.txt", 2)
    with pytest.raises(ValueError, match="does not fit device memory.*more stages"):
        fixed_plan(p, V100X16, 128, 1, [16], 1, Limits(schedule="gpipe", optimizer_factor=6))


def test_zero_device_cluster_is_refused():
    with pytest.raises(ValueError, match="at least one"):
        Topology("empty", 0, 8, 1e9, 1, 1e9, 1e9)


def test_a_layer_costs_its_fixed_part_once_and_the_rest_per_sample():
    from dapple_launch.profile.measure import per_call

    layers = [
        LayerProfile("a", 3e-3, 5e-3, 1e6, 1e6, forward_fixed_s=1e-3, backward_fixed_s=1e-3),
        LayerProfile("b", 2e-3, 4e-3, 1e6, 1e6),
    ]
    p = chain("m", layers, batch_size=2)
    assert p.seconds(0, 2, 2) == pytest.approx((5e-3, 9e-3))  # at the profile batch: the profile's times
    assert p.seconds(0, 2, 8) == pytest.approx((1e-3 + 2e-3 * 4 + 2e-3 * 4, 1e-3 + 4e-3 * 4 + 4e-3 * 4))
    assert per_call(3.0, 9.0, 2, 8) == pytest.approx(1.0)  # t = 1 + n: the line's intercept
    assert per_call(3.0, 2.0, 2, 8) == 3.0 and per_call(3.0, 30.0, 2, 8) == 0.0  # noise: kept within [0, t]


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_measured_profile_is_real_and_cached(tmp_path, monkeypatch):
    from dapple_launch.profile import measure_profile

    monkeypatch.setenv("DAPPLE_CACHE", str(tmp_path))
    model = build_model("gpt", "tiny", num_layers=2, hidden=32, heads=2, seq_len=16)
    p = measure_profile(model, 4, repeats=2)
    assert p.source.startswith("measured:cpu") and [x.name for x in p.layers] == ["embed", "block0", "block1", "head"]
    assert all(x.forward_s > 0 and x.backward_s > 0 for x in p.layers[1:])
    assert p.layers[1].parameter_bytes == analytic_profile(model, 4, 1, "x").layers[1].parameter_bytes
    assert p.layers[1].activation_bytes == 4 * 16 * 32 * 4  # batch × seq × hidden fp32
    # each layer's fixed cost per call (fitted from 4 and 16 samples) is a part of its time
    assert all(0 <= x.forward_fixed_s <= x.forward_s and 0 <= x.backward_fixed_s <= x.backward_s for x in p.layers)
    (cached,) = (tmp_path / "profiles").glob("*.json")
    assert measure_profile(model, 4) == p  # read back from the cache, not re-measured
    assert ModelProfile.from_json(cached.read_text()) == p


class _Busy(torch.nn.Module):
    """A layer whose forward waits `_Busy.sleep_s(n)` on its n-th call: other work on the machine,
    slowing every repetition of one whole pass of the profiler (6 calls at repeats=2: 3 repetitions,
    1 warm-up, two forwards each). `wait`: time.sleep, or a step of a test's own clock."""

    calls = 0
    sleep_s = staticmethod(lambda n: 0.002)
    wait = staticmethod(time.sleep)

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        _Busy.wait(_Busy.sleep_s(_Busy.calls))
        _Busy.calls += 1
        return self.lin(x)


class _BusyModel(PipelineModel):
    name = "busy"

    def layers(self):
        return [
            LayerSpec("in", lambda: torch.nn.Linear(8, 8)),
            LayerSpec("busy", _Busy),
            LayerSpec("out", lambda: torch.nn.Linear(8, 1)),
        ]

    def loss(self, output, target):
        return (output.squeeze(-1) - target) ** 2

    def batch(self, n, generator=None, device="cpu"):
        x = torch.randn(n, 8, generator=generator)
        return x.to(device), x.sum(1).to(device)


def _named_layers(line: str) -> list[int]:
    """The layers an unsettled-profile warning names ("... on layers [0, 1] ...")."""
    import re

    found = re.search(r"on layers \[([0-9, ]*)\]", line)
    return [int(x) for x in found.group(1).split(",") if x.strip()] if found else []


def test_a_pass_slowed_throughout_by_other_work_is_outvoted_by_later_passes(tmp_path, monkeypatch):
    import logging

    import dapple_launch.profile.measure as measure
    from dapple_launch.log import get_logger
    from dapple_launch.profile import measure_profile

    monkeypatch.setenv("DAPPLE_CACHE", str(tmp_path))
    # The busy layer's waits advance the profiler's clock rather than sleep: a real sleep of 2 ms
    # overshoots by more than the 20 % passes must agree within when other work shares the cores (two
    # busy loops on the 2 cores: 1 run in 6 saw the later passes disagree), and what is tested is
    # how the passes are voted, not the machine's scheduler.
    clock = [0.0]
    real = time.perf_counter
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: real() + clock[0]))
    monkeypatch.setattr(_Busy, "wait", staticmethod(lambda s: clock.__setitem__(0, clock[0] + s)))
    lines: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())
    get_logger().addHandler(handler)
    try:
        # the whole first pass at the profile batch is slow (20 ms), every later one 2 ms
        monkeypatch.setattr(_Busy, "calls", 0)
        monkeypatch.setattr(_Busy, "sleep_s", staticmethod(lambda n: 0.02 if n < 6 else 0.002))
        p = measure_profile(_BusyModel(), 2, repeats=2, use_cache=False)
        assert 0.0015 < p.layers[1].forward_s < 0.01, p.layers[1]  # 2 ms, not the busy pass's 20
        assert _Busy.calls >= 18  # a third pass settled it: the first two disagreed
        # (the tiny linear layers around it may jitter past 50 µs on a loaded machine: only layer 1 counts)
        assert not any(1 in _named_layers(x) for x in lines), lines
        # each pass twice as slow as the one before: no two agree, and the profile says so (only this
        # measurement's warnings: the first one's may name a jittering linear layer too)
        lines.clear()
        monkeypatch.setattr(_Busy, "calls", 0)
        monkeypatch.setattr(_Busy, "sleep_s", staticmethod(lambda n: 0.002 * 2 ** ((n // 6) % 4)))
        measure_profile(_BusyModel(), 2, repeats=2, use_cache=False)
        (line,) = [x for x in lines if "measured profile of busy" in x]
        assert "no two of 4 passes agreed within 20% on layers [" in line and "quieter machine" in line, line
        assert 1 in _named_layers(line), line
    finally:
        get_logger().removeHandler(handler)


def test_passes_agree_by_layer_and_combine_by_median():
    from dapple_launch.profile.measure import combine_passes, unsettled

    row = lambda f, b, w=0.0: ("x", f, b, 10.0, 20.0, 30.0, w)
    one, two = [row(1e-3, 2e-3), row(5e-3, 9e-3, 4e-3)], [row(1.1e-3, 2.1e-3), row(2e-3, 4e-3, 2e-3)]
    assert unsettled([one, two]) == [1]  # layer 0 within 20 %, layer 1 2.5x apart
    assert unsettled([one, two, [row(1e-3, 2e-3), row(2.2e-3, 4.2e-3)]]) == []  # two of three agree
    assert unsettled([[row(10e-6, 10e-6)], [row(40e-6, 50e-6)]]) == []  # under 50 µs apart: jitter
    combined = combine_passes([one, two, [row(1e-3, 2e-3), row(2.2e-3, 4.2e-3, 2.1e-3)]])
    assert combined[1] == ("x", 2.2e-3, 4.2e-3, 10.0, 20.0, 30.0, 2.1e-3)  # the medians; bytes as counted


def test_a_profile_whose_layers_all_take_no_time_is_refused_wherever_it_comes_from():
    """The planner balances stages by time and states plans as shares of it: a profile of zero time
    (a model's own profile_layers, a hand-built chain) is refused with the fix, not divided by."""
    from dapple_launch.profile import LayerProfile, chain

    with pytest.raises(
        ValueError,
        match=r"profile 'idle': all 2 layers have forward and backward time 0; give each "
        r"layer its measured time",
    ):
        chain("idle", [LayerProfile("a", 0.0, 0.0, 1.0, 0.0), LayerProfile("b", 0.0, 0.0, 1.0, 8.0)], batch_size=1)
    assert (
        chain("one", [LayerProfile("a", 0.0, 0.0, 1.0, 0.0), LayerProfile("b", 0.0, 1e-3, 1.0, 8.0)], 1).num_layers == 2
    )
