"""Fixtures for the Qwen3-TTS parity tests: tiny checkpoints and reference outputs, once a session."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.models.qwen3_tts.qwen3_fixtures import REF_PYTHON, build_checkpoints, reference_outputs


@pytest.fixture(scope="session")
def ref_available() -> None:
    if not REF_PYTHON.is_file():
        pytest.skip(f"the qwen-tts reference venv is absent ({REF_PYTHON}); build it with "
                    "tests/models/qwen3_tts/make_reference_venv.sh")


@pytest.fixture(scope="session")
def ckpt_root(ref_available, tmp_path_factory) -> Path:
    """custom/ and base/: tiny checkpoints written by the reference's own save_pretrained."""
    return build_checkpoints(tmp_path_factory.mktemp("qwen3_tts_ckpt"))


@pytest.fixture(scope="session")
def reference(ckpt_root, tmp_path_factory) -> dict:
    """Every reference output the tests compare with (one subprocess run)."""
    return reference_outputs(ckpt_root, tmp_path_factory.mktemp("qwen3_tts_ref"))
