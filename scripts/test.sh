#!/usr/bin/env bash
# Installs what the tests need (idempotent) and runs every test tier: pure (no processes), one
# process, several gloo processes, the Slurm tier and the multi-node tier (jobs across nodes, a node
# killed, a link cut, an allocation) against a real Slurm of two nodes, each in its own network
# namespace; this script installs Slurm (as root, from Debian's packages), starts it, and stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] && .venv/bin/python -c "import dapple_launch, pytest" 2>/dev/null || bash scripts/setup.sh
export WANDB_MODE=disabled
# Every process of the tests (launchers, zygotes, workers, test ranks) imports much of the package:
# compiled once here, as an environment with PYTHONDONTWRITEBYTECODE=1 (this machine's) never writes
# what it compiles on import and recompiles it in each (1.2 s of every launcher and zygote)
.venv/bin/python -m compileall -q -j 2 dapple_launch tests benchmarks > /dev/null
serial="faults"
if [ "${DAPPLE_SKIP_SLURM:-0}" != 1 ]; then
  if bash slurm/dev-cluster.sh start --nodes 2 --cpus-per-node 4; then
    trap 'bash slurm/dev-cluster.sh stop' EXIT
    serial="faults or slurm or nodes"
  else
    echo "the Slurm tiers are skipped: slurm/dev-cluster.sh could not start Slurm (it needs root to install)" >&2
  fi
fi
rc=0
# pure, one-process and several-process tiers and the wheel's install (mostly waiting on pip), two
# tests at a time (pytest-xdist); the tiers that time detection (faults) or share the one Slurm run
# alone, one test at a time
# (--durations: each tier's slowest tests, where the time budget goes, in every run's log)
.venv/bin/python -m pytest -q -n 2 --durations=25 -m "not faults and not slurm and not nodes" "$@" || rc=$?
.venv/bin/python -m pytest -q --durations=15 -m "$serial" "$@" || { r=$?; [ $r = 5 ] || rc=$r; }  # (5: the arguments chose none)
exit $rc
