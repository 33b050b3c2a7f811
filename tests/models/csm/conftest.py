"""Fixtures for the CSM parity tests: tiny checkpoints, reference outputs and voice files, once a session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.models.csm.csm_fixtures import REF_PYTHON, VOICES, build_and_run, write_voice


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: one thread avoids thread-pool overheads on a loaded 2-core machine (a
    depth-decoder step took milliseconds per op with two threads there, microseconds with one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def ref_available() -> None:
    if not REF_PYTHON.is_file():
        pytest.skip(f"the CSM reference venv is absent ({REF_PYTHON}); build it with "
                    "tests/models/csm/make_reference_venv.sh")


@pytest.fixture(scope="session")
def _reference_run(ref_available, tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("csm_ckpt")
    return root, build_and_run(root, tmp_path_factory.mktemp("csm_ref"))


@pytest.fixture(scope="session")
def ckpt_root(_reference_run) -> Path:
    """main/ and stop/: tiny checkpoints written by the reference's own save_pretrained."""
    return _reference_run[0]


@pytest.fixture(scope="session")
def reference(_reference_run) -> dict:
    """Every reference output the tests compare with (the same subprocess run)."""
    return _reference_run[1]


@pytest.fixture(scope="session")
def voice_refs(tmp_path_factory) -> dict:
    """The test voices as 16-bit WAV files with their records (voice id, path, rate, sha256, transcript)."""
    folder = tmp_path_factory.mktemp("csm_voices")
    return {name: write_voice(folder, name) for name in VOICES}
