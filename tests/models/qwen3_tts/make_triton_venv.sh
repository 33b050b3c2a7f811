#!/usr/bin/env bash
# Builds a virtual environment with Triton beside the CPU torch, for the tests that run our
# Triton kernels in Triton's CPU interpreter (TRITON_INTERPRET=1; tests/triton_interpreter.py:
# test_conv_triton.py, tests/models/kyutai_tts/test_attend_triton.py,
# tests/engine/llm/test_sample_triton.py). A test tool only:
# on a GPU host Triton comes with CUDA torch. Kept apart from the project's venv so that the
# other tests run without Triton installed, as on a CPU-only install.
#
#   VOXGATE_TRITON_VENV  where the venv goes (default: <repo>/.venvs/triton)
#
# Idempotent: an existing venv that imports triton is left as it is.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
venv="${VOXGATE_TRITON_VENV:-$repo/.venvs/triton}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import torch, triton" >/dev/null 2>&1; then
  echo "triton venv ready: $venv"
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q "triton>=3.4" "numpy>=1.26"
"$venv/bin/python" -c "import torch, triton" && echo "triton venv built: $venv"
