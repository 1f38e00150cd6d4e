"""`python -m dapple_launch --help`: the tool's own page (Hydra's stays at --hydra-help)."""

from __future__ import annotations

from .config import CONF_DIR


def wants_help(argv: list[str]) -> bool:
    return any(a in ("--help", "-h") for a in argv)


def _options(group: str) -> str:
    return ", ".join(sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")))


HELP = f"""\
dapple_launch: plan and run hybrid pipeline + data-parallel training (DAPPLE) from a config.

usage: python -m dapple_launch [GROUP=OPTION ...] [KEY=VALUE ...] [--cfg job --resolve] [-m]
       dapple-launch ...            (the same, installed as a command)

Config groups (GROUP=OPTION):
  model      {_options("model")}
  cluster    {_options("cluster")}
  strategy   {_options("strategy")}     (default: fixed on this machine's CPU clusters, auto elsewhere)
  data       {_options("data")}
  logger     {_options("logger")}
  launcher   {_options("launcher")}
  +recipe    {_options("recipe")}

Keys set most often:
  global_batch_size=N            samples per iteration (optimizer step)
  dry_run=true                   plan, print the plan, write plan.json; start nothing
  trainer.max_steps=N            iterations to train
  trainer.precision=P            auto | 32 | bf16-mixed | 16-mixed
  strategy.stages=S strategy.replicas=[R,..] strategy.num_micro_batches=M   (strategy=fixed)
  strategy.schedule=1f1b|gpipe|zb_h1 strategy.warmup_depth=K                 (strategy=fixed)
  strategy.schedule=interleaved_1f1b|interleaved_zb strategy.chunks=v | zbv | chimera  (strategy=fixed; groups
      holding several stages: stages counts all of them, replicas one per group)
  strategy.schedule=1f1b_rr|zb_h1_rr strategy.copies=[C,..]  (strategy=fixed; a stage's replicas as C
      round-robin copies, each running whole micro-batches in turn: PipeDream's replicated stages)
  strategy.max_stages=S strategy.search_nodes=N                             (strategy=auto)
  strategy.schedules=[1f1b,zb_h1,interleaved_1f1b,interleaved_zb,zbv,chimera,1f1b_rr,zb_h1_rr]  the families
      to choose from (strategy=auto; default all eight)
  strategy.recompute=none|full|selective|auto  activation recomputation; selective takes
      strategy.recompute_counts=[first layers per stage] or strategy.recompute_layers=[positions]
  strategy.objective=time|memory|pareto strategy.memory_budget_gib=G       (strategy=auto; pareto writes
      pareto.json and pareto.svg: run a point with strategy=file strategy.plan_file=... strategy.plan_index=K)
  strategy.devices=auto strategy.deadline_s_per_iteration=T | strategy.max_devices=N   the cheapest allocation
  strategy.token_slices=auto|none|[l1,l2,..]  TeraPipe: pipeline token slices of each sequence (causal models)
  model.preset=NAME model.num_layers=N model.hidden=H                       (gpt, bert)
  model.target=PKG.MODULE:CALLABLE model.args={{k:v}}                         (model=custom)
  data.path=PATH data.seq_len=N                                              (data=text_file, tokens)
  ckpt_path=last                 resume the newest complete checkpoint of hydra.run.dir
  hydra.run.dir=DIR              where plan, config, logs and checkpoints go

Examples:
  python -m dapple_launch                                         the CPU demo: 2 stages × 2 replicas
  python -m dapple_launch model=bert cluster=v100x16 global_batch_size=128 dry_run=true
  python -m dapple_launch +recipe=gpt2-medium-a100x64 dry_run=true
  python -m dapple_launch model=custom model.target=my_model:build data=text_file data.path=book.txt
  python -m dapple_launch hydra.run.dir=runs/a ckpt_path=last trainer.max_steps=1200

More: README.md; every key with its type: python -m dapple_launch --cfg job; Hydra's flags: --hydra-help
"""
