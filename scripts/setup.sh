#!/usr/bin/env bash
# Creates .venv and installs the project. torch is pinned to the CPU build first so the
# project's torch range is already met (an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -e ".[test,hf,tensorboard]"
# the package's own files compiled now: pip compiles what it installs but not an editable project,
# and where PYTHONDONTWRITEBYTECODE=1 nothing compiled on import is kept (1.2 s of every launch)
.venv/bin/python -m compileall -q dapple_launch > /dev/null
