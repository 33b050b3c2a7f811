"""The program contract: what the model-agnostic LM runtime asks of a model.

A program (``models/<name>/program.py``) turns text into prompt ids and tokens into audio, one
sequence's state per row; it never sees jobs or streams. ``docs/adding_a_model.md`` explains
the hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from engine.backend import BackendInfo
from engine.llm.kernels import check_kernel
from engine.llm.scheduler import check_token_buckets
from engine.llm.sequence import SamplingParams

__all__ = ["Collect", "KVShape", "LoadContext", "Program", "ProgramModel", "ServingDefaults", "SlotProgram",
           "StagingProgram", "StreamingProgram", "codec_dtype"]

Collect = Callable[[], "list[np.ndarray | None]"]  # waits for a launched piece of work, gives its audio


class Program(Protocol):
    info: BackendInfo
    stop_ids: frozenset[int]
    vocab_ids: torch.Tensor | None  # the head's columns (None: whole vocabulary)
    allowed_table: torch.Tensor | None  # bool [R, K]: per-row column masks

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]: ...

    def build_prompt(self, text: str, voice: str, options: dict[str, Any]) -> list[int]: ...

    def sampling_params(self, options: dict[str, Any]) -> SamplingParams: ...

    def new_state(self, voice: str, options: dict[str, Any]) -> Any: ...

    def allowed_row(self, state: Any, ahead: int = 0) -> int:
        """The row of ``allowed_table`` for the sequence's next token, counting ``ahead`` more
        audio tokens than ``launch_postprocess`` has recorded (the backend launches the next
        step before the program has seen this one's tokens; each of them must then advance
        the position by one, as every allowed audio token does)."""
        ...

    def launch_postprocess(self, states: list[Any], tokens: list[Any]) -> Collect:
        """One generated (non-stop) token per row (a list of codebooks per row when the head
        samples a frame): its bookkeeping now, its audio started; ``collect()`` gives the new
        audio per row (None if none)."""
        ...

    def launch_finish(self, states: list[Any]) -> Collect:
        """These sequences ended (stop or max_tokens): ``collect()`` gives each one's remaining
        audio."""
        ...

    def release(self, state: Any) -> None:
        """The sequence was dropped without ``finish`` (aborted, failed): free what it holds."""
        ...

    def note_step_interval(self, seconds: float) -> None:
        """The time from one engine step to the next while steps run back to back (the backend
        calls it every such step): a program may adapt to the load, e.g. its start-up ramp."""
        ...

    def note_due(self, state: Any, due_in_s: float) -> None:
        """The sequence's next audio is needed ``due_in_s`` from now (the backend passes on the
        engine core's deadlines): a program may skip work that only serves an early start."""
        ...


class StreamingProgram(Program, Protocol):
    """Optional hooks of a program that takes its text while it speaks (native input streaming).

    A job is then a whole turn: ``add_job``'s text and later ``push_text`` calls reach
    ``push_text``; the sequence starts once ``prompt_ids`` can build its prompt, and each decode
    row's input is ``next_input`` (the next text token, say), not the last token sampled. When
    ``next_input`` has nothing yet (the text ran out on a turn that has not ended) the sequence
    pauses: it keeps its pages and slot and resumes when text arrives. Pausing must never change
    the tokens: the same text gives the same inputs whenever it arrives.
    """

    input_streaming: bool  # True
    # KV tokens reserved at admission (the turn's length is unknown; it grows page by page), or None
    reserve_tokens: int | None

    def push_text(self, state: Any, text: str, *, flush: bool, final: bool) -> None:
        """More text of the turn (``flush``: release a word cut short too; ``final``: the last).
        Raise ``ValueError`` for text the model cannot speak: that job fails alone."""
        ...

    def prompt_ids(self, state: Any) -> list[int] | None:
        """The prompt, once the text received allows it (None: wait for more)."""
        ...

    def next_input(self, state: Any, position: int) -> int | None:
        """The input id of the decode row that generates output ``position`` (0-based; outputs
        still on the device count), or None while the text it needs has not arrived."""
        ...


class SlotProgram(Program, Protocol):
    """Optional hook of a program whose model keeps per-slot device state (a speaker vector the
    embedding reads, say): called before a sequence's first step, with its batch slot."""

    def bind_slot(self, state: Any, slot: int) -> None: ...


class StagingProgram(Program, Protocol):
    """Optional hook of a program that stages per-row device writes (in ``next_input`` or
    ``bind_slot``) rather than copying each one as it comes: called once before each step's
    launch, after every row's input and slot are set, it copies them in one go (one small copy
    per row costs the host several launches, and a step of hundreds of rows as many)."""

    def flush_inputs(self) -> None: ...


@dataclass(frozen=True)
class ServingDefaults:
    """A program's scheduling defaults for the automatic (-1) settings on CUDA, as measured for
    its model (``docs/performance.md``); on the CPU the runtime turns these features off."""

    decode_cap: int = 0  # max_num_decode_seqs (0: no cap): the largest batch whose step keeps real time
    decode_cap_fp8: int = 0  # the same with fp8 weights
    decode_horizon_s: float = 1.0
    decode_fill_seqs: int = 256
    prefill_wait_s: float = 0.05  # with prefill graphs (no mixed graphs)
    prefill_batch_seqs: int = 8
    prefill_token_buckets: tuple[int, ...] = ()  # the prefill graphs' token counts, () = the runner's
    # AdmissionConfig.decode_cap_budget for -1 (the model's): the decode cap measured from step
    # times below decode_cap, as a fraction of the real-time step; 0 = off, the constant cap stands
    decode_cap_budget: float = 0.0
    decode_cap_budget_fp8: float = 0.0  # the same with fp8 weights
    light_steps: int = 0  # scheduler light_steps_max (the head's ``light_until_step``), 0 = off
    sampler_kernel: str = "torch"  # the runtime sampler's draw (``Sampler.kernel``) for ``--sampler-kernel auto``
    # the kernels for --decode-attention / --kv-write auto on CUDA (``engine.llm.kernels``; a
    # Triton one only where Triton imports)
    decode_attention: str = "cuda-cores"
    kv_write: str = "index"

    def __post_init__(self) -> None:
        check_token_buckets(self.prefill_token_buckets)  # as the option's
        check_kernel("decode_attention", self.decode_attention, auto=False)
        check_kernel("kv_write", self.kv_write, auto=False)
        for name in ("decode_cap_budget", "decode_cap_budget_fp8"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"ServingDefaults.{name} must be in [0, 1] (0: off), got {getattr(self, name)}")


@dataclass
class LoadContext:
    """What the runtime tells a program's ``load`` (``engine.llm.build``)."""

    model_id: str  # the short name, hub id or local path that selected the program
    device: str  # "cuda" or "cpu" (resolved)
    dtype: torch.dtype
    load_format: str  # "auto" | "dummy"
    max_num_seqs: int
    max_model_len: int  # tokens a row holds: --max-model-len, or DEFAULT_MAX_MODEL_LEN when that is auto
    quantise_fp8: bool  # quantise the decoder's linears to fp8 (engine.llm.fp8) before graph_forward is built
    use_graphs: bool  # the CUDA-graph runner will serve (CUDA, FlashInfer, graphs enabled)
    setting: Callable[[str, Any], Any]  # a program-specific setting: keyword override, then EngineConfig, then default
    max_model_len_auto: bool = False  # no --max-model-len given: a model with fewer positions serves those (model_len)


DEFAULT_MAX_MODEL_LEN = 2048  # --max-model-len auto, where the model has at least these positions


def model_len(ctx: LoadContext, positions: int, *, extendable: bool = False) -> int:
    """The tokens a row holds for a model trained on (or with a RoPE table of) ``positions``:
    with ``--max-model-len`` auto the fewer of ``ctx.max_model_len`` and ``positions`` (as vLLM
    takes the model's own length); a length asked beyond ``positions`` is a ValueError naming
    the flag, unless ``extendable`` (the model runs past them; a warning is the program's).
    A program that serves fewer than ``ctx.max_model_len`` returns it as ``ProgramModel.max_model_len``."""
    if ctx.max_model_len <= positions or extendable and not ctx.max_model_len_auto:
        return ctx.max_model_len
    if ctx.max_model_len_auto:
        return positions
    raise ValueError(f"--max-model-len {ctx.max_model_len} exceeds the model's {positions} positions: "
                     f"pass {positions} or less, or leave it out (auto: the model's length)")


@dataclass(frozen=True)
class KVShape:
    """A ``ProgramModel.kv_shape`` for a program whose model config is not shaped like one."""

    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int


def codec_dtype(ctx: LoadContext, device: str | None = None) -> torch.dtype:
    """A program's ``codec_dtype`` setting: "auto" (bf16 on CUDA, fp32 on the CPU: ``device``,
    default the LM's), "float32" or "bfloat16"; anything else is a ValueError."""
    name = ctx.setting("codec_dtype", "auto")
    if name == "auto":
        name = "bfloat16" if (device or ctx.device).startswith("cuda") else "float32"
    if name not in ("float32", "bfloat16"):
        raise ValueError(f"codec_dtype must be auto, float32 or bfloat16, got {name!r}")
    return getattr(torch, name)


@dataclass
class ProgramModel:
    """A loaded program, as its ``load`` returns it to the runtime.

    ``model`` is the eager step's ``forward(ids [T], positions [T], attn)`` (``uses_token_rows``:
    also each token's state row [T]) returning hidden states [T, H]; ``kv_shape`` has
    ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``.
    ``head``: the ``TokenHead`` (None: ``SingleTokenHead`` over ``model.compute_logits`` with the
    program's ``vocab_ids`` / ``allowed_table``). ``graph_forward``: the forward captured in the
    CUDA graphs (None: ``model``). ``supports_mixed_graphs``: the forward may run decode rows
    and packed prompts in one pass.
    """

    program: Any  # Program
    model: Any
    kv_shape: Any
    head: Any = None
    graph_forward: Callable[..., torch.Tensor] | None = None
    uses_token_rows: bool = False
    supports_mixed_graphs: bool = True
    defaults: ServingDefaults = field(default_factory=ServingDefaults)
    # The device the program put its codec on, when it honours the ``codec_device`` setting
    # (None: it does not, the codec is on the LM's device; the runtime then refuses the setting).
    codec_device: str | None = None
    # The tokens a row holds when the program serves fewer than ``ctx.max_model_len`` (its
    # ``model_len``: --max-model-len auto and a model with fewer positions); None: ctx's.
    max_model_len: int | None = None
