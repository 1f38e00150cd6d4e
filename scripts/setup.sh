#!/usr/bin/env bash
# Creates .venv and installs the project. torch is pinned to the CPU build first so the
# project's torch range is already met (an unpinned torch would pull a multi-GB CUDA build).
# --no-compile: Python compiles each module on its first import anyway; compiling all of torch's
# up front took 17 of the 25 s of its install here.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q --no-compile "torch==2.13.0"
.venv/bin/pip install -q --no-compile -e ".[test,hf,tensorboard]"
