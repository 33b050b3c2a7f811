#!/usr/bin/env bash
# Builds the virtual environment of the CSM reference (transformers 5.24.0:
# CsmForConditionalGeneration and MimiModel) for the CSM parity tests (tests/models/csm). A test
# tool only: the serving path never imports transformers' CSM. It lives apart from the project's
# venv so that its transformers version is pinned on its own.
#
#   VOXGATE_CSM_REF_VENV  where the venv goes (default: <repo>/.venvs/csm-ref)
#
# torch==2.13.0 (the CPU build) goes in first so that transformers' torch extra does not pull a
# CUDA build. Idempotent: an existing venv that imports CsmForConditionalGeneration is left as it is.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
venv="${VOXGATE_CSM_REF_VENV:-$repo/.venvs/csm-ref}"
check='from transformers import CsmForConditionalGeneration, MimiModel, PreTrainedTokenizerFast'
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
  echo "CSM reference venv ready: $venv"
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q transformers==5.24.0 safetensors tokenizers
"$venv/bin/python" -c "$check" && echo "CSM reference venv built: $venv"
