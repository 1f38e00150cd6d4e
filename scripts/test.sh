#!/usr/bin/env bash
# Installs what the tests need (idempotent) and runs every test tier: pure (no processes), one
# process, several gloo processes, the Slurm tier against a real one-node Slurm, and the multi-node
# tier against a Slurm of two nodes in network namespaces; this script installs Slurm (as root, from
# Debian's packages), starts each cluster, and stops it again.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] && .venv/bin/python -c "import dapple_launch, pytest" 2>/dev/null || bash scripts/setup.sh
export WANDB_MODE=disabled
tiers=(-m "not slurm and not nodes")
slurm=0
if [ "${DAPPLE_SKIP_SLURM:-0}" != 1 ]; then
  if bash slurm/dev-cluster.sh start; then
    trap 'bash slurm/dev-cluster.sh stop' EXIT
    tiers=(-m "not nodes")
    slurm=1
  else
    echo "the Slurm tiers are skipped: slurm/dev-cluster.sh could not start Slurm (it needs root to install)" >&2
  fi
fi
.venv/bin/python -m pytest -q "${tiers[@]}" "$@"
# The multi-node tier on a cluster of its own: two slurmds, each in its own network namespace.
if [ "$slurm" = 1 ]; then
  bash slurm/dev-cluster.sh stop
  if bash slurm/dev-cluster.sh start --nodes 2 --cpus-per-node 2; then
    .venv/bin/python -m pytest -q -m nodes "$@" || [ $? = 5 ]  # (5: the arguments chose no test of it)
  else
    echo "the multi-node tier is skipped: slurm/dev-cluster.sh could not start two nodes" >&2
  fi
fi
