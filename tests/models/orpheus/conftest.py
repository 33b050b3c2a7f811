"""Fixtures for the Orpheus tests (helpers live in orpheus_fixtures, a uniquely named module)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.models.orpheus.orpheus_fixtures import make_small_codec, save_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny tied-embedding Orpheus-vocab Llama checkpoint directory (HF layout)."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_orpheus"))


@pytest.fixture(scope="session")
def hf_model(tiny_dir):
    """transformers' reference model on the same weights, fp32, eval."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def small_codec():
    """A ``SnacDecoder`` over a random SNAC 24 kHz with a narrow decoder (fast on the CPU)."""
    return make_small_codec()
