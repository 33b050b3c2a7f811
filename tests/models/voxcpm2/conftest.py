"""Fixtures for the VoxCPM2 parity tests: a tiny checkpoint and the reference's outputs, once a session."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.models.voxcpm2.voxcpm2_fixtures import REF_PYTHON, build_checkpoints, load_ours, reference_outputs


@pytest.fixture(scope="session")
def ref_available() -> None:
    if not REF_PYTHON.is_file():
        pytest.skip(f"the voxcpm reference venv is absent ({REF_PYTHON}); build it with "
                    "tests/models/voxcpm2/make_reference_venv.sh")


@pytest.fixture(scope="session")
def ckpt_root(ref_available, tmp_path_factory) -> Path:
    """base/ (the released layout, written by the reference's own modules) and lora/ (an adapter)."""
    return build_checkpoints(tmp_path_factory.mktemp("voxcpm2_ckpt"))


@pytest.fixture(scope="session")
def reference(ckpt_root, tmp_path_factory) -> dict:
    """Every reference output the tests compare with (one subprocess run)."""
    return reference_outputs(ckpt_root, tmp_path_factory.mktemp("voxcpm2_ref"))


@pytest.fixture(scope="session")
def ours(ckpt_root):
    """Our load of the tiny checkpoint (float32)."""
    return load_ours(ckpt_root)


@pytest.fixture(scope="session")
def ours_lora(ckpt_root):
    """Our load of the tiny checkpoint with the reference-format adapter folded in."""
    return load_ours(ckpt_root, lora=True)
