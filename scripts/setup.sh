#!/usr/bin/env bash
# Creates .venv and installs the project. torch is pinned to the CPU build first so the
# project's torch range is already met (an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -e ".[test,hf,tensorboard]"
