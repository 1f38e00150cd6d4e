#!/usr/bin/env bash
# Installs what the tests need (idempotent) and runs the default test tiers:
# pure (no processes), one process, several gloo processes.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] && .venv/bin/python -c "import dapple_launch, pytest" 2>/dev/null || bash scripts/setup.sh
export WANDB_MODE=disabled
exec .venv/bin/python -m pytest -q "$@"
