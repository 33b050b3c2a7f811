#!/usr/bin/env bash
# Builds the virtual environment of the reference package moshi 0.2.13 for the Kyutai TTS and
# Mimi parity tests (tests/models/kyutai_tts, tests/models/mimi). A test tool only: the serving
# path never imports moshi. moshi pins torch < 2.10, so it goes in with --no-deps after the CPU
# torch 2.13.0, followed by its other requirements by hand (the bounds are moshi's own).
#
#   VOXGATE_MOSHI_REF_VENV  where the venv goes (default: <repo>/.venvs/moshi-ref)
#
# Idempotent: an existing venv that imports moshi is left as it is.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
venv="${VOXGATE_MOSHI_REF_VENV:-$repo/.venvs/moshi-ref}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import moshi.models" >/dev/null 2>&1; then
  echo "moshi reference venv ready: $venv"
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q --no-deps moshi==0.2.13
"$venv/bin/pip" install -q "numpy>=1.26,<2.3" "safetensors>=0.4.0,<0.8" "huggingface-hub>=0.24,<1.0" \
  "einops>=0.7,<0.9" "sentencepiece>=0.2,<0.3" "sphn>=0.2.0,<0.3" "aiohttp>=3.10.5,<3.12" "tqdm"
"$venv/bin/python" -c "import moshi.models" && echo "moshi reference venv built: $venv"
