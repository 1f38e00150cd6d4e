#!/usr/bin/env bash
# Installs what the tests need (idempotent) and runs every test tier: pure (no processes), one
# process, several gloo processes, and the Slurm tier against a real one-node Slurm, which this
# script installs (as root, from Debian's packages), starts, and stops again.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] && .venv/bin/python -c "import dapple_launch, pytest" 2>/dev/null || bash scripts/setup.sh
export WANDB_MODE=disabled
tiers=(-m "not slurm")
if [ "${DAPPLE_SKIP_SLURM:-0}" != 1 ]; then
  if bash slurm/dev-cluster.sh start; then
    trap 'bash slurm/dev-cluster.sh stop' EXIT
    tiers=(-m "slurm or not slurm")
  else
    echo "the Slurm tier is skipped: slurm/dev-cluster.sh could not start Slurm (it needs root to install)" >&2
  fi
fi
.venv/bin/python -m pytest -q "${tiers[@]}" "$@"
