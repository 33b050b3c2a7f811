"""Fixtures for the CSM parity tests: tiny checkpoints, reference outputs and voice files, once a session."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.models.csm.csm_fixtures import REF_PYTHON, VOICES, build_checkpoints, reference_outputs, write_voice


@pytest.fixture(scope="session")
def ref_available() -> None:
    if not REF_PYTHON.is_file():
        pytest.skip(f"the CSM reference venv is absent ({REF_PYTHON}); build it with "
                    "tests/models/csm/make_reference_venv.sh")


@pytest.fixture(scope="session")
def ckpt_root(ref_available, tmp_path_factory) -> Path:
    """main/ and stop/: tiny checkpoints written by the reference's own save_pretrained."""
    return build_checkpoints(tmp_path_factory.mktemp("csm_ckpt"))


@pytest.fixture(scope="session")
def reference(ckpt_root, tmp_path_factory) -> dict:
    """Every reference output the tests compare with (one subprocess run)."""
    return reference_outputs(ckpt_root, tmp_path_factory.mktemp("csm_ref"))


@pytest.fixture(scope="session")
def voice_refs(tmp_path_factory) -> dict:
    """The test voices as 16-bit WAV files with their records (voice id, path, rate, sha256, transcript)."""
    folder = tmp_path_factory.mktemp("csm_voices")
    return {name: write_voice(folder, name) for name in VOICES}
