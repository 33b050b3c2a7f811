"""Fixtures for the Mimi parity tests: a tiny moshi-made checkpoint and reference outputs, once a session."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.models.mimi.mimi_fixtures import REF_PYTHON, build_checkpoint, reference_outputs


@pytest.fixture(scope="session")
def moshi_ref() -> None:
    if not REF_PYTHON.is_file():
        pytest.skip(f"the moshi reference venv is absent ({REF_PYTHON}); build it with "
                    "tests/models/kyutai_tts/make_reference_venv.sh")


@pytest.fixture(scope="session")
def mimi_ckpt(moshi_ref, tmp_path_factory) -> Path:
    """A tiny Mimi written by moshi's own state_dict (safetensors)."""
    return build_checkpoint(tmp_path_factory.mktemp("mimi_ckpt"))


@pytest.fixture(scope="session")
def mimi_reference(mimi_ckpt, tmp_path_factory) -> dict:
    """Every reference output the Mimi tests compare with (one subprocess run)."""
    return reference_outputs(mimi_ckpt, tmp_path_factory.mktemp("mimi_ref"))
