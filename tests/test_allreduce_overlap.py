"""The gradient all-reduce in buckets that overlap a stage's last backward: the cost model's account
(planner/allreduce.py), its bounds, and the runtime that does it (runtime/executor.py GradientSync)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dapple_launch.models.split_backward import backward_input
from dapple_launch.planner.allreduce import bucket_layers, overlapped
from dapple_launch.runtime.executor import GradientSync, gradient_buckets

pytestmark = pytest.mark.fast


def _step_by_step(seconds, nbytes, allreduce, cap):
    """The same account as a plain event list: each layer done at its time (last layer first), a
    bucket sent over the link once its weights are in and the link is free."""
    done, t = {}, 0.0
    for i in reversed(range(len(seconds))):
        t += seconds[i]
        done[i] = t
    link, total, bucket, size = 0.0, 0.0, [], 0.0
    for i in reversed(range(len(seconds))):
        bucket.append(i)
        size += nbytes[i]
        if size >= cap or i == 0:
            weighted = [j for j in bucket if nbytes[j] > 0]
            if weighted:
                ar = allreduce(size)
                link = max(link, done[min(weighted)]) + ar
                total += ar
            bucket, size = [], 0.0
    return total, max(0.0, link - t) if total else 0.0


def test_the_exposed_all_reduce_is_the_event_accounts_and_within_the_searchs_bounds():
    rng = random.Random(0)
    for _ in range(500):
        L = rng.randint(1, 9)
        seconds = [rng.uniform(0, 2) for _ in range(L)]
        nbytes = [rng.choice([0.0, rng.uniform(1, 40)]) for _ in range(L)]
        slope, fixed = rng.uniform(0.01, 0.5), rng.choice([0.0, rng.uniform(0, 0.3)])

        def allreduce(b):
            return slope * b + fixed if b > 0 else 0.0

        cap = rng.choice([1e-9, 10.0, 30.0, 1e9])
        total, exposed = overlapped(seconds, nbytes, allreduce, cap)
        want = _step_by_step(seconds, nbytes, allreduce, cap)
        assert (total, exposed) == pytest.approx(want, rel=1e-12, abs=1e-12)
        if total:
            # what branch.py and bounds.py cut with: all of one all-reduce of every byte, less the action
            assert exposed >= allreduce(sum(nbytes)) - sum(seconds) - 1e-12
            assert exposed <= total + 1e-12
    # one bucket (a cap above every byte) hides nothing but the link's wait for the last layer...
    assert overlapped([1.0, 1.0], [5.0, 5.0], lambda b: b / 10, cap=100) == pytest.approx((1.0, 1.0))
    # ... one per layer sends the last layer's while the first is computed
    assert overlapped([1.0, 1.0], [5.0, 5.0], lambda b: b / 10, cap=1) == pytest.approx((1.0, 0.5))


def test_the_runtime_cuts_the_buckets_the_cost_model_costs():
    """Whole layers from the last, each bucket closed at the cap: the same positions both sides."""
    rng = random.Random(1)
    for _ in range(50):
        widths = [rng.choice([0, 1, 4, 16, 32]) for _ in range(rng.randint(1, 8))]
        layers = [nn.Linear(w, 8) if w else nn.ReLU() for w in widths]
        per_layer = [list(layer.parameters()) for layer in layers]
        nbytes = [sum(p.numel() * p.element_size() for p in ps) for ps in per_layer]
        cap = rng.choice([1, 200, 600, 2000, 10**9])
        where = {id(p): i for i, ps in enumerate(per_layer) for p in ps}
        runtime = [sorted({where[id(p)] for p in bucket}) for bucket in gradient_buckets(per_layer, cap)]
        model = [sorted(i for i in bucket if nbytes[i] > 0) for bucket in bucket_layers(nbytes, cap)]
        assert runtime == model


@pytest.fixture
def one_rank(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("split", [False, True])
def test_buckets_are_sent_while_the_last_backward_still_runs(one_rank, split):
    """Armed before the last backward (B, or under a split backward the last W), each bucket goes out
    once its gradients are in: when the first layer's gradient arrives the later layers' buckets are
    already sent. The sums are the gradients (one rank here) and every parameter gets its own back."""
    torch.manual_seed(0)
    layers = nn.ModuleList([nn.Linear(6, 6) for _ in range(3)])
    params = list(layers.parameters())
    sync = GradientSync(params, None, 2, [list(x.parameters()) for x in layers], bucket_bytes=1)
    assert [len(b) for b in sync.buckets] == [2, 2, 2]
    x = torch.randn(4, 6, requires_grad=True)

    def forward():
        y = x
        for layer in layers:
            y = torch.tanh(layer(y))
        return y.square().sum()

    forward().backward()  # an earlier micro-batch: nothing is watched yet
    assert not sync.works
    sent_when_first_arrived = []
    first = layers[0].weight
    if split:
        _, pending = backward_input([forward()], None, [x], params)
        import dapple_launch.models.split_backward as sb

        seen = sb._accumulate

        def spy(ps, gs):
            if any(p is first for p in ps):
                sent_when_first_arrived.append(len(sync.works))
            seen(ps, gs)

        sb._accumulate = spy
        try:
            sync.arm()
            pending.run()
        finally:
            sb._accumulate = seen
    else:
        loss = forward()
        first.register_post_accumulate_grad_hook(lambda p: sent_when_first_arrived.append(len(sync.works)))
        sync.arm()
        loss.backward()
    expected = [p.grad.clone() for p in params]
    assert sent_when_first_arrived and sent_when_first_arrived[0] == 2  # layers 2 and 1 already out
    sync.start()
    assert [k for k, _, _ in sync.works] == [0, 1, 2]  # in bucket order, as every replica issues them
    sync.finish()
    for p, g in zip(params, expected):
        assert torch.equal(p.grad, g)


def test_a_bucket_whose_gradient_never_comes_holds_the_later_ones_until_the_action_ends(one_rank):
    """Replicas issue their collectives in one order: a bucket waits for the ones before it, and what
    never reported (a layer this micro-batch did not use) goes when the action ends, as zeros."""
    layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
    params = list(layers.parameters())
    sync = GradientSync(params, None, 2, [list(x.parameters()) for x in layers], bucket_bytes=1)
    x = torch.randn(2, 4)
    sync.arm()
    layers[0](x).sum().backward()  # only the first layer: the buckets of layers 2 and 1 never report
    assert not sync.works  # bucket 2 (layer 0) is ready but waits for 0 and 1
    sync.start()
    assert [k for k, _, _ in sync.works] == [0, 1, 2]
    sync.finish()
    assert torch.equal(layers[2].weight.grad, torch.zeros_like(layers[2].weight))
    assert layers[0].weight.grad.abs().sum() > 0


def test_the_planners_stage_costs_are_that_account():
    """cost.stage_allreduce (prefix sums, one entry per bucket) equals overlapped on the stage's
    per-layer backward (a last B) and per-layer W (its share of each layer's backward)."""
    from dapple_launch.cluster import Topology
    from dapple_launch.planner.cost import StageSpec, stage_allreduce

    from .test_planner import random_profile

    rng = random.Random(2)
    topo = Topology("t", 2, 4, 1e12, 10, 20e9, 1e9, inter_node_allreduce_bandwidth=3e9)
    checked = 0
    for _ in range(40):
        profile = random_profile(rng, 8)
        for _ in range(10):
            a = rng.randrange(0, 8)
            z = rng.randrange(a + 1, 9)
            first = rng.randrange(0, 7)
            devices = tuple(range(first, min(8, first + rng.randint(2, 8))))
            samples, share = rng.choice([1, 3, 8]), rng.choice([None, 0.3])
            got = stage_allreduce(profile, topo, StageSpec(a, z, devices), samples, share)
            backward = [profile.seconds(i, i + 1, samples)[1] for i in range(a, z)]
            weights = [profile.layers[i].parameter_bytes for i in range(a, z)]
            ratio = 1.0 if a == 0 else 0.5 if share is None else share
            total, after_b = overlapped(backward, weights, lambda b: topo.allreduce_s(devices, b))
            after_w = overlapped([x * ratio for x in backward], weights, lambda b: topo.allreduce_s(devices, b))[1]
            assert got == pytest.approx((total, after_b, after_w), rel=1e-9, abs=1e-15)
            checked += total > 0 and 0 < after_b < total
    assert checked > 20  # overlap that hides part of the all-reduce, not all or none of it
