"""Fixtures for the Kyutai TTS parity tests: a tiny checkpoint made by moshi and its outputs, once a session."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.models.kyutai_tts.kyutai_fixtures import REF_PYTHON, build_checkpoint, reference_outputs


@pytest.fixture(scope="session")
def moshi_ref() -> None:
    if not REF_PYTHON.is_file():
        pytest.skip(f"the moshi reference venv is absent ({REF_PYTHON}); build it with "
                    "tests/models/kyutai_tts/make_reference_venv.sh")


@pytest.fixture(scope="session")
def tts_ckpt(moshi_ref, tmp_path_factory) -> Path:
    """A tiny Kyutai TTS checkpoint folder written by moshi (config, LM, Mimi, tokenizer, voices)."""
    return build_checkpoint(tmp_path_factory.mktemp("kyutai_ckpt") / "tiny")


@pytest.fixture(scope="session")
def tts_reference(tts_ckpt, tmp_path_factory) -> dict:
    """Every reference output the Kyutai TTS tests compare with (one subprocess run)."""
    return reference_outputs(tts_ckpt, tmp_path_factory.mktemp("kyutai_ref"))
