"""What a person reads: the tool's own --help, one line per refusal with exit code 2, Slurm's
refusals with their likely cause, the schedule re-base warning, checkpoint rotation and `last`."""

from __future__ import annotations

import pytest

from dapple_launch.cli import Refusal, check

from .conftest import cli


def test_help_is_the_tools_own(tmp_path):
    out = cli(["--help"], tmp_path)
    assert out.returncode == 0
    for needle in (
        "Config groups",
        "model ",
        "custom",
        "strategy",
        "+recipe",
        "trainer.precision",
        "dry_run=true",
        "Examples:",
        "ckpt_path=last",
    ):
        assert needle in out.stdout, needle
    assert "_schema" not in out.stdout and "Powered by Hydra" not in out.stdout


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["trainer.max_steps=-3"], "trainer.max_steps=-3: must be >= 1"),
        (["trainer.max_steps=0"], "trainer.max_steps=0: must be >= 1"),
        (["trainer.timeout_s=-5"], "trainer.timeout_s=-5.0: must be > 0"),
        (["trainer.lr=-1"], "trainer.lr=-1.0: must be a number > 0"),
        (["strategy.stages=0"], "strategy.stages=0: must be >= 1"),
        (["strategy.num_micro_batches=0"], "strategy.num_micro_batches=0: must be >= 1"),
        (["global_batch_size=0"], "global_batch_size=0: must be >= 1"),
        (["trainer.checkpoint_every_n_steps=0"], "trainer.checkpoint_every_n_steps=0: must be >= 1"),
        (["strategy.replicas=[2,0]"], "every replica count must be >= 1"),
        (["cluster.device_memory_gib=0"], "cluster.device_memory_gib=0.0: must be a number > 0"),
        (["data.num_workers=-1"], "data.num_workers=-1: must be >= 0"),
        (["cluster.action_overhead_us=-20"], "cluster.action_overhead_us=-20.0: must be >= 0"),
    ],
)
def test_every_value_is_checked_before_anything_starts(overrides, needle):
    with pytest.raises(Refusal) as e:
        check(overrides)
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["data.num_train=3"], "data.num_train=3 is fewer samples than one global batch"),
        (["data.num_val=1"], "data.num_val=1 cannot be split across the 2 replicas of a stage"),
        (["ckpt_path=/no/such/checkpoint"], "ckpt_path=/no/such/checkpoint does not exist"),
        (["trainer.max_steps=many"], "trainer.max_steps=many: expected integer"),
        (["model.hidn=3"], "did you mean model.hidden"),
    ],
)
@pytest.mark.slow
def test_refusals_are_one_line_with_exit_code_2(tmp_path, args, needle):
    out = cli(
        [
            "model.num_layers=2",
            "model.hidden=32",
            "model.heads=2",
            "model.seq_len=16",
            *args,
            f"hydra.run.dir={tmp_path}/run",
        ],
        tmp_path,
    )
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "logs").exists()


def test_slurm_refusals_say_the_likely_cause():
    from dapple_launch.launch.slurm import slurm_refusal

    text = slurm_refusal("sbatch: error: Invalid generic resource (gres) specification")
    assert "Invalid generic resource" in text and "cluster.device_kind=cpu" in text
    assert "slurm/dev-cluster.sh start" in slurm_refusal(
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"
    )


def test_a_longer_run_without_a_decay_horizon_warns_that_the_schedule_is_rebased(capsys):
    from omegaconf import OmegaConf

    from dapple_launch.log import setup
    from dapple_launch.run_dir import warn_if_schedule_rebased

    setup()
    meta = {"global_step": 600, "lr_schedule": {"decay_steps": 600, "warmup_steps": 10}}
    cfg = OmegaConf.create({"trainer": {"lr": 3e-3, "max_steps": 1200, "lr_decay_steps": None}})
    warn_if_schedule_rebased(cfg, meta)
    err = capsys.readouterr().err
    assert "re-based to 1200 steps" in err and "from 0.0003 to 0.00" in err and "trainer.lr_decay_steps=600" in err
    cfg.trainer.lr_decay_steps = 600
    warn_if_schedule_rebased(cfg, meta)
    assert capsys.readouterr().err == ""


def test_rotation_counts_the_checkpoint_a_run_resumed_from_and_last_follows_the_newest(tmp_path):
    from dapple_launch.runtime.checkpointing import Checkpointing

    from .test_checkpoint_files import save

    save(tmp_path, 4)  # the run resumed from this one
    keeper = Checkpointing(tmp_path, every_n_steps=2, keep=2)
    save(tmp_path, 6)
    keeper._rotate_and_link()
    save(tmp_path, 8)
    keeper._rotate_and_link()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "step000006.ckpt", "step000008.ckpt"]
    assert (tmp_path / "last.ckpt").resolve() == (tmp_path / "step000008.ckpt").resolve()


def test_the_closing_summary_says_why_a_guessed_estimate_is_off_and_how_to_measure(tmp_path, compose_cfg):
    """On a CPU cluster planned from its stated figures (the analytic profile), an estimate more than
    GUESS_WARNING away from the measured time is followed by where it came from and the option that
    measures this machine instead; a close one, or a measured one, is not."""
    import json

    from dapple_launch.launch.job import closing_summary, guessed_estimate

    guessed = guessed_estimate(compose_cfg([]))  # the embedded default: local, fixed, analytic
    assert guessed is not None and "strategy.profile_source=measured" in guessed and "device_tflops=0.05" in guessed
    assert guessed_estimate(compose_cfg(["strategy.profile_source=measured"])) is None
    assert guessed_estimate(compose_cfg(["cluster=v100x16", "dry_run=true"])) is None  # a datasheet's figures
    summary = {"steps": [0, 8], "train_loss": 1.0, "estimated_s_per_iteration": 0.02, "samples_per_s": 100.0}
    for measured, said in [(0.041, True), (0.0105, True), (0.024, False)]:
        (tmp_path / "summary.json").write_text(json.dumps({**summary, "measured_s_per_iteration": measured}))
        text = closing_summary(tmp_path, guessed=guessed)
        assert (guessed in text) is said, (measured, text)
        assert guessed not in closing_summary(tmp_path)


def test_the_closing_summary_sets_a_gpu_runs_peak_memory_against_the_estimate(tmp_path):
    """A GPU run's summary.json carries the allocator's peak on the fullest device and the plan's
    estimate (runtime/progress.py); the closing summary says both and how far apart (the figures of
    an earlier H200 run), and the allocator's cache flushes where there were any; a CPU run's summary
    has none of it and says nothing."""
    import json

    from dapple_launch.launch.job import closing_summary

    summary = {"steps": [0, 8], "train_loss": 6.47, "estimated_s_per_iteration": 1.547, "samples_per_s": 36.4}
    summary["measured_s_per_iteration"] = 1.714
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert "device memory" not in closing_summary(tmp_path)
    gpu = {**summary, "measured_peak_memory_bytes": 126.5 * 2**30, "estimated_peak_memory_bytes": 117.3 * 2**30}
    (tmp_path / "summary.json").write_text(json.dumps(gpu))
    line = [x for x in closing_summary(tmp_path).splitlines() if "device memory" in x]
    assert line == ["  126.5 GiB peak device memory allocated, 117.3 GiB estimated (+8%)"], line
    assert "allocator" not in closing_summary(tmp_path)  # none retried: nothing said
    (tmp_path / "summary.json").write_text(json.dumps({**gpu, "allocator_retries": 3}))
    line = [x for x in closing_summary(tmp_path).splitlines() if "allocator" in x]
    assert len(line) == 1 and "freed its cache 3 times" in line[0] and "strategy.memory_budget_gib" in line[0], line


def test_the_closing_summary_says_when_the_training_loss_rose(tmp_path):
    """A run whose last training loss is over 1.1x its first step's says it diverged and names the
    settings to lower (GPT-2 large on an H200 at the default learning rate ended 6 steps at 21.07,
    where an untrained model starts near ln 50257 = 10.8: benchmarks/results/gpu-large.json); a
    falling loss, or one step, says nothing."""
    import json

    from dapple_launch.launch.job import closing_summary

    for first, last, steps, said in [
        (10.9, 21.07, [0, 6], True),
        (10.9, 6.47, [0, 8], False),
        (10.9, 21.0, [0, 1], False),
    ]:
        summary = {"steps": steps, "train_loss": last, "first_train_loss": first}
        (tmp_path / "summary.json").write_text(json.dumps(summary))
        lines = [x for x in closing_summary(tmp_path).splitlines() if "diverged" in x]
        assert len(lines) == said, (first, last, steps, lines)
        if said:
            assert "10.9000" in lines[0] and "21.0700" in lines[0] and "trainer.lr" in lines[0]
