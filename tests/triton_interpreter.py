"""Running a script in Triton's CPU interpreter (TRITON_INTERPRET=1), in the venv that
tests/models/qwen3_tts/make_triton_venv.sh builds (CI builds it): the tests of our Triton
kernels, which serve on CUDA only. The script prints one JSON object as its last line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("VOXGATE_TRITON_VENV", REPO / ".venvs" / "triton"))
PYTHON = VENV / "bin" / "python"


def run_interpreted(script: Path) -> dict:
    """``script``'s JSON, run by the Triton venv's python with the interpreter on; skips the test
    when that venv is absent."""
    if not PYTHON.is_file():
        pytest.skip(f"the Triton venv is absent ({PYTHON}); build it with tests/models/qwen3_tts/make_triton_venv.sh")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO))
    done = subprocess.run([str(PYTHON), str(script)], env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
