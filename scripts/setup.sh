#!/usr/bin/env bash
# Creates .venv and installs the project. torch is pinned to the CPU build first so the
# project's torch range is already met (an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q --no-compile "torch==2.13.0"
.venv/bin/pip install -q --no-compile -e ".[test,hf,tensorboard]"
# Everything compiled now, on every core (pip compiles what it installs one file at a time, and not
# an editable project at all): where PYTHONDONTWRITEBYTECODE=1 nothing compiled on import is kept,
# so an uncompiled module is compiled again in every process (torch, Lightning and transformers:
# ~10 s of each launch). A file of the environment compileall cannot read is skipped, as pip skips
# it (torch ships a test fixture in Python 3.12's syntax): that status is not this script's; the
# package's own must compile.
.venv/bin/python -m compileall -q -j 0 .venv/lib > /dev/null || true
.venv/bin/python -m compileall -q -j 0 dapple_launch > /dev/null
