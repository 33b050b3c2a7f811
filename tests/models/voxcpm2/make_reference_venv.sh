#!/usr/bin/env bash
# Builds the virtual environment of the reference package voxcpm 2.0.3 for the VoxCPM2 parity
# tests. A test tool only (the serving path never imports voxcpm); it lives apart from the
# project's venv because voxcpm resolves its own transformers (5.x). The tests run it as a
# subprocess and skip when it is absent.
#
#   VOXGATE_VOXCPM_REF_VENV  where the venv goes (default: <repo>/.venvs/voxcpm-ref)
#
# torch==2.13.0 (the CPU build) goes in first so that voxcpm's unpinned torch does not pull a
# CUDA build. Idempotent: an existing venv that imports voxcpm's VoxCPM2 model is left as it is.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
venv="${VOXGATE_VOXCPM_REF_VENV:-$repo/.venvs/voxcpm-ref}"
# voxcpm imports torchaudio (whose PyPI build does not load beside CPU torch) for its V1 model
# only; the check and the tests stub it (tests/models/voxcpm2/reference_run.py).
check='import sys, types, importlib.machinery as m; t = types.ModuleType("torchaudio"); t.__spec__ = m.ModuleSpec("torchaudio", None); sys.modules["torchaudio"] = t; from voxcpm.model.voxcpm2 import VoxCPM2Model'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
  echo "voxcpm reference venv ready: $venv"
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q voxcpm==2.0.3
"$venv/bin/python" -c "$check" && echo "voxcpm reference venv built: $venv"
