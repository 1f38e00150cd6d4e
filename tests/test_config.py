"""One process: every shipped config composes and plans; bad keys fail with their full path."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import OmegaConfBaseException

from dapple_launch.config import CONF_DIR
from dapple_launch.plan_config import plan_from_config

from .conftest import TINY_GPT

MODELS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
CLUSTERS = sorted(p.stem for p in (CONF_DIR / "cluster").glob("*.yaml"))
GPU_FIXED = {
    "v100x16": ["strategy=fixed", "strategy.replicas=[8]", "global_batch_size=128", "strategy.num_micro_batches=8"],
    "v100-16x1": [
        "strategy=fixed",
        "strategy.stages=4",
        "strategy.replicas=[4]",
        "global_batch_size=128",
        "strategy.num_micro_batches=8",
    ],
    "v100-16x1-10g": [
        "strategy=fixed",
        "strategy.stages=4",
        "strategy.replicas=[4]",
        "global_batch_size=128",
        "strategy.num_micro_batches=8",
    ],
    "a100x64": [
        "strategy=fixed",
        "strategy.stages=4",
        "strategy.replicas=[16]",
        "global_batch_size=512",
        "strategy.num_micro_batches=8",
    ],
    "h100x8": ["strategy=fixed", "strategy.replicas=[4]", "global_batch_size=64", "strategy.num_micro_batches=8"],
    "local": [],
    "slurm-dev": [],
    "from_slurm": [],
}
# what cluster=from_slurm reads inside an allocation of 2 nodes × 2 CPU tasks
ALLOCATION = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
PROFILE = ["model.profile=bert-48-pbs-2"]  # a shipped profile, by name


def test_every_config_group_option_is_tested():
    assert set(CLUSTERS) == set(GPU_FIXED)
    assert {"gpt", "bert", "vgg19", "from_profile", "custom", "hf"} <= set(MODELS)


@pytest.mark.slow
@pytest.mark.parametrize("cluster", CLUSTERS)
@pytest.mark.parametrize("model", MODELS)
def test_every_model_on_every_cluster_plans(compose_cfg, model, cluster, monkeypatch, tmp_path_factory):
    for key, value in ALLOCATION.items():
        monkeypatch.setenv(key, value)
    extra = PROFILE if model == "from_profile" else []
    if model == "hf":  # a tiny Llama directory, as save_pretrained writes it
        from .hf_models import save

        root = tmp_path_factory.getbasetemp() / "hf-config"
        where = root / "llama" if (root / "llama").is_dir() else save("llama", root)
        extra = [f"model.config={where}", "model.init=random", "model.seq_len=16"]
    if model == "custom":
        extra = ["model.target=tests.custom_models.skipnet:build", "+model.args.layers=6"]
    cpu = cluster in ("local", "slurm-dev", "from_slurm")
    if cpu and model in ("bert", "vgg19"):
        extra = ["model.preset=tiny"]
    if cpu and model == "from_profile":
        pytest.skip("a V100 profile on CPU processes: planned on the GPU clusters instead")
    cfg = compose_cfg([f"model={model}", f"cluster={cluster}", *GPU_FIXED[cluster], *extra])
    plan = plan_from_config(cfg)
    if cfg.strategy.name == "fixed":
        assert plan.world_size == cfg.cluster.nodes * cfg.cluster.devices_per_node
    else:  # strategy=auto (from_slurm): the planner may leave devices idle when fewer are faster
        assert plan.world_size <= cfg.cluster.nodes * cfg.cluster.devices_per_node
    assert plan.micro_batch_size * plan.num_micro_batches == cfg.global_batch_size


@pytest.mark.parametrize(
    "override,needle",
    [
        ("model.hiden=3", "model.hiden"),
        ("+model.hiden=3", "hiden"),
        ("trainer.max_steps=many", "trainer.max_steps"),
        ("strategy.replicas=two", "strategy.replicas"),
    ],
)
def test_misspelled_or_mistyped_key_names_full_path(compose_cfg, override, needle):
    with pytest.raises((ConfigCompositionException, OmegaConfBaseException)) as e:
        cfg = compose_cfg([override])
        _ = cfg.plan  # the resolver checks the schema before planning
    text = str(e.value) + str(getattr(e.value, "__cause__", ""))
    assert needle in text


@pytest.mark.parametrize("group,name", [("model", "gtp"), ("cluster", "v100x99"), ("strategy", "magic")])
def test_unknown_group_option_lists_valid_ones(group, name):
    from dapple_launch.cli import Refusal, check

    with pytest.raises(Refusal, match=f"{group}={name} is not an option of {group}.*valid: "):
        check([f"{group}={name}"])


@pytest.mark.multiprocess  # the links are measured between 4 real gloo processes
def test_auto_plans_the_local_job_from_measured_layers_and_links(compose_cfg, tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("DAPPLE_CACHE", str(tmp_path))
    overrides = [
        "strategy=auto",
        "strategy.profile_source=measured",
        "model.num_layers=2",
        "model.hidden=32",
        "model.heads=2",
        "model.seq_len=16",
    ]
    cfg = compose_cfg(overrides)
    plan = plan_from_config(cfg)
    assert plan.planner.startswith("auto") and plan.world_size <= 4
    assert plan.micro_batch_size * plan.num_micro_batches == cfg.global_batch_size
    layers = [p for p in (tmp_path / "profiles").glob("*.json") if not p.name.startswith(("links-", "actions-"))]
    links = json.loads(next((tmp_path / "profiles").glob("links-gloo-4p-*c.json")).read_text())
    assert layers and links["processes"] == 4
    for key in ("p2p_latency_s", "p2p_bandwidth", "allreduce_latency_s", "allreduce_bandwidth"):
        assert 0 < links[key] < float("inf")
    # the runtime's own cost per action, measured on an idle pipeline of 4 processes, is in every estimate
    actions = json.loads(next((tmp_path / "profiles").glob("actions-gloo-4p-*c-torch*.json")).read_text())
    assert actions["processes"] == 4 and 0 < actions["action_overhead_s"] < 0.1
    assert {c["action_s"] for c in plan.estimate.stage_costs} == {actions["action_overhead_s"]}
    assert plan_from_config(cfg) == plan  # all read back from the cache: the same plan
    # a cluster that states its cost per action is taken at its word
    stated = plan_from_config(compose_cfg([*overrides, "cluster.action_overhead_us=250"]))
    assert [c["action_s"] for c in stated.estimate.stage_costs] == pytest.approx([250e-6] * len(stated.stages))
    # a custom model whose layers pass tuples is measured as well (the links are cached by now)
    custom = compose_cfg(
        [
            "strategy=auto",
            "strategy.profile_source=measured",
            "model=custom",
            "model.target=tests.custom_models.skipnet:build",
        ]
    )
    assert plan_from_config(custom).num_layers == 6


@pytest.mark.slow  # (over a second: out of the fast tier)
def test_a_measured_profile_is_timed_again_where_the_plan_runs(compose_cfg, tmp_path, monkeypatch):
    """plan_config.at_operating_point: a plan whose device runs 32 samples per micro-batch is not
    costed from a line through 2 and 8 samples: the layers are timed again at 8 and 32 and the plan's
    estimate is made from that profile; a plan inside the first profile's range is planned once."""
    from dapple_launch.models.from_config import model_from_config
    from dapple_launch.plan_config import profile_from_config, topology_from_config

    monkeypatch.setenv("DAPPLE_CACHE", str(tmp_path))
    one = ["cluster.devices_per_node=1", "cluster.action_overhead_us=0", "strategy.profile_source=measured"]
    one += ["strategy.stages=1", "strategy.replicas=[1]", *TINY_GPT]

    def batches():
        names = [p.name for p in (tmp_path / "profiles").glob("gpt-b*.json")]
        return sorted(int(n.split("-b")[1].split("-")[0]) for n in names)

    inside = plan_from_config(compose_cfg([*one, "global_batch_size=16", "strategy.num_micro_batches=2"]))
    assert inside.device_samples() == (8,) and batches() == [2]
    cfg = compose_cfg([*one, "global_batch_size=32", "strategy.num_micro_batches=1"])
    plan = plan_from_config(cfg)
    assert plan.device_samples() == (32,) and batches() == [2, 8]
    at_8 = profile_from_config(cfg, topology_from_config(cfg.cluster), 8)
    assert at_8.batch_size == 8 and len(at_8.layers) == len(model_from_config(cfg.model).layers())
    forward, _ = at_8.seconds(0, len(at_8.layers), 32)
    assert plan.estimate.stage_costs[0]["forward_s"] == pytest.approx(forward, rel=1e-9)


def test_action_cost_fit_recovers_the_cost_per_action():
    """runtime/action_cost.py: the cost per action that makes the simulator of the idle pipeline take
    the measured time is the one that produced it; none when the pipeline is no slower than its layers."""
    from dapple_launch.runtime.action_cost import fit_action_cost
    from dapple_launch.schedule import StageCosts, build_schedule, simulate

    for world, f, b, send, a in [
        (2, 1e-5, 2e-5, 1.3e-4, 6e-4),
        (4, 3e-5, 5e-5, 1e-4, 1.1e-3),
        (1, 1e-5, 1e-5, 0.0, 7e-5),
    ]:
        costs = [StageCosts(f, b, send if s < world - 1 else 0.0, send if s else 0.0, action_s=a) for s in range(world)]
        took = simulate(build_schedule("1f1b", world, 2 * world), costs, record=False).iteration_s
        assert fit_action_cost(world, took, f, b, send) == pytest.approx(a, rel=1e-6)
    assert fit_action_cost(2, 1e-6, 1e-5, 2e-5, 1e-4) == 0.0


def test_links_fit_recovers_latency_and_bandwidth():
    from dapple_launch.profile.links import LARGE, SMALL, _fit

    for fixed, bw, scale in [(3e-4, 2e9, 1.0), (5e-3, 9e8, 1.5)]:
        got = _fit(fixed + scale * SMALL / bw, fixed + scale * LARGE / bw, scale)
        assert got == pytest.approx((fixed, bw), rel=1e-9)


def test_unknown_profile_source():
    from dapple_launch.cli import Refusal, check

    with pytest.raises(
        Refusal, match="strategy.profile_source=guess is not a valid choice: expected one of analytic, measured"
    ):
        check(["strategy.profile_source=guess"])
