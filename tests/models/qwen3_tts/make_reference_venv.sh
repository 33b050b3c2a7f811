#!/usr/bin/env bash
# Builds the virtual environment of the reference package qwen-tts 0.1.1 for the parity tests.
# It is a test tool only (the serving path never imports qwen-tts) and lives apart from the
# project's venv because qwen-tts resolves transformers 4.57.x. The tests run it as a
# subprocess and skip when it is absent.
#
#   VOXGATE_QWEN_TTS_REF_VENV  where the venv goes (default: <repo>/.venvs/qwen-tts-ref)
#
# torch==2.13.0 (the CPU build) goes in first so that qwen-tts' unpinned torch does not pull a
# CUDA build. Idempotent: an existing venv that imports qwen_tts is left as it is.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
venv="${VOXGATE_QWEN_TTS_REF_VENV:-$repo/.venvs/qwen-tts-ref}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import qwen_tts" >/dev/null 2>&1; then
  echo "qwen-tts reference venv ready: $venv"
  exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q qwen-tts==0.1.1
# The only torchaudio on the index (2.11.1) is built against a CUDA torch 2.11: its C++
# extension cannot load beside the CPU torch 2.13, and `import torchaudio` then fails.
# qwen-tts uses torchaudio only for compliance.kaldi.fbank (pure PyTorch, the 25 Hz
# tokenizer), and torchaudio treats a missing extension as "not built", so the binaries go.
rm -f "$venv"/lib/python3*/site-packages/torchaudio/lib/*.so
"$venv/bin/python" -c "import qwen_tts" && echo "qwen-tts reference venv built: $venv"
