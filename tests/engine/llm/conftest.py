"""Fixtures: a tiny random Orpheus-vocabulary Llama checkpoint (shared with tests/models/orpheus),
our model on its weights, and builders of a runner, scheduler and LMBackend around it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from engine.backend import BackendInfo
from engine.llm.backend import LMBackend
from engine.llm.model_runner import ModelRunner
from engine.llm.page_allocator import PageAllocator
from engine.llm.scheduler import Scheduler, SchedulerConfig
from engine.llm.sequence import SamplingParams
from tests.models.orpheus.orpheus_fixtures import make_small_codec, save_tiny_checkpoint


@pytest.fixture(scope="session")
def llm_tiny_dir(tmp_path_factory):
    """Tiny tied-embedding Llama (vocab 156,940, hidden 64, 2 layers, GQA 4/2) in HF layout."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("llm_tiny"), seed=1)


@pytest.fixture(scope="session")
def llm_fi_dir(tmp_path_factory):
    """The tiny Llama with head_dim 64, the smallest FlashInfer's kernels take (GPU tests that build
    the CUDA-graph runner through the real loader; head_dim 16 is refused by FlashInfer)."""
    return save_tiny_checkpoint(tmp_path_factory.mktemp("llm_fi"), seed=1, head_dim=64)


@pytest.fixture(scope="session")
def llm_hf_model(llm_tiny_dir):
    """transformers' reference ``LlamaForCausalLM`` on the checkpoint, fp32, eval."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(llm_tiny_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def llm_model(llm_tiny_dir, llm_hf_model):
    """Our ``LlamaModel`` with the same weights (fp32, CPU)."""
    from models.orpheus.config import LlamaConfig
    from models.orpheus.llama import LlamaModel

    config = LlamaConfig.from_hf_dict(json.loads((llm_tiny_dir / "config.json").read_text()))
    model = LlamaModel(config, max_seq_len=4096)
    sd = {k: v for k, v in llm_hf_model.state_dict().items() if k != "lm_head.weight"}
    model.load_state_dict(sd, strict=True)
    return model.eval()


def make_runner(model, *, num_pages: int = 64, page_size: int = 4, max_num_seqs: int = 8, **kw) -> ModelRunner:
    """A CPU fp32 runner with small pages, so sequences span several pages."""
    return ModelRunner(
        model, model.config, device="cpu", dtype=torch.float32, num_pages=num_pages,
        page_size=page_size, max_num_seqs=max_num_seqs, **kw,
    )


def make_scheduler(runner: ModelRunner, **kw) -> Scheduler:
    cfg = dict(max_num_seqs=runner.max_num_seqs, max_num_batched_tokens=16, max_model_len=128, max_waiting=16)
    cfg.update(kw)
    return Scheduler(SchedulerConfig(**cfg), PageAllocator(runner.spec.num_pages, runner.page_size))


@dataclass
class TokenProgram:
    """A test program: the 'text' is space-separated prompt ids; it records generated tokens.

    Options: ``tag`` (key for ``tokens``), sampling fields as in ``SamplingParams``.
    """

    vocab_ids: torch.Tensor | None = None
    allowed_table: torch.Tensor | None = None
    stop_ids: frozenset[int] = frozenset()
    tokens: dict[Any, list[int]] = field(default_factory=dict)
    step_intervals: list[float] = field(default_factory=list)
    dues: list[tuple[Any, float]] = field(default_factory=list)  # (state, due_in_s) per note_due
    info: BackendInfo = BackendInfo("tokens", ("v",), "v", 24000)

    def validate(self, voice, options):
        return voice or "v", dict(options)

    def build_prompt(self, text, voice, options):
        return [int(t) for t in text.split()]

    def sampling_params(self, options):
        keys = ("temperature", "top_p", "repetition_penalty", "seed", "max_tokens")
        return SamplingParams(**{k: options[k] for k in keys if k in options})

    def new_state(self, voice, options):
        return self.tokens.setdefault(options.get("tag"), [])

    def allowed_row(self, state, ahead=0):
        return 0

    def launch_postprocess(self, states, tokens):
        for state, tok in zip(states, tokens):
            state.append(tok)
        return lambda: [None] * len(states)

    def launch_finish(self, states):
        return lambda: [np.zeros(0, np.float32) for _ in states]

    def note_step_interval(self, seconds):
        self.step_intervals.append(seconds)

    def note_due(self, state, due_in_s):
        self.dues.append((state, due_in_s))


def make_backend(model, program=None, *, runner_kw=None, sched_kw=None) -> LMBackend:
    program = program or TokenProgram()
    runner = make_runner(
        model, vocab_ids=program.vocab_ids, allowed_table=program.allowed_table, **(runner_kw or {})
    )
    return LMBackend(program, runner, make_scheduler(runner, **(sched_kw or {})))


def drain(backend: LMBackend, max_steps: int = 10_000) -> list:
    """Step until no work is left; returns every output."""
    outs = []
    for _ in range(max_steps):
        if not backend.has_work():
            return outs
        outs.extend(backend.step())
    raise AssertionError("backend did not finish")


@pytest.fixture(scope="session")
def small_codec():
    """A ``SnacDecoder`` over a random SNAC 24 kHz with a narrow decoder (fast on the CPU)."""
    return make_small_codec()


def make_orpheus_program(codec, **kw):
    """An ``OrpheusProgram`` on the shared test tokenizer that also records each job's tokens
    (``program.tokens[options["tag"]]``)."""
    from models.orpheus.program import OrpheusProgram
    from tests.models.orpheus.orpheus_fixtures import build_tokenizer

    class Recording(OrpheusProgram):
        def __init__(self) -> None:
            super().__init__(build_tokenizer(), codec, **kw)
            self.tokens: dict[Any, list[int]] = {}

        def new_state(self, voice, options):
            state = super().new_state(voice, options)
            state.tokens = self.tokens.setdefault(options.get("tag"), [])
            return state

        def launch_postprocess(self, states, tokens):
            for state, tok in zip(states, tokens):
                state.tokens.append(tok)
            return super().launch_postprocess(states, tokens)

    return Recording()
