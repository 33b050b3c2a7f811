"""A sequence: one job's token ids, pages and progress, as the scheduler and runner see it."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PENDING", "SamplingParams", "Sequence", "SequenceStatus"]


@dataclass(frozen=True)
class SamplingParams:
    """Per-sequence sampling settings. ``temperature == 0`` means greedy; ``top_k`` 0 is off.

    ``seed`` with the sequence's step counter fixes its random stream, independent of the
    batch it shares. ``max_tokens`` counts generated tokens (the stop token included).
    """

    temperature: float = 0.6
    top_p: float = 0.8
    repetition_penalty: float = 1.3
    seed: int = 0
    max_tokens: int = 1200
    top_k: int = 0  # 0 = off

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


PENDING = -1  # an output id whose token is still on the device (asynchronous steps)


class SequenceStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED = 2


@dataclass(eq=False)
class Sequence:
    """Token ids and KV progress of one job.

    ``num_computed_tokens`` tokens have their K/V in the cache. The next step feeds
    ``token_ids[num_computed_tokens:...]``; a row is sampled when its chunk reaches the last
    token. ``slot`` is the batch slot (0..max_num_seqs-1) while running, else -1; per-row
    device state (e.g. the repetition-penalty mask) lives at that slot.
    """

    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    slot: int = -1
    # Row of the runner's ``allowed_table`` that constrains this sequence's next token (the
    # program sets it, e.g. to the codebook of the next audio position); 0 when unused.
    allowed_row: int = 0
    program_state: Any = None
    # time.monotonic() by which this job's next audio is needed (engine.backend set_deadline);
    # orders admission and prefill. Infinity (none given) keeps arrival order.
    deadline_s: float = math.inf
    awaits_first_audio: bool = False  # deadline_s is a first-audio target (set_deadline)
    # the scheduler's clock when the sequence was admitted (how long its prompt has waited)
    ready_s: float = 0.0
    # Asynchronous steps (``Scheduler.advance``): the row, in the launched step, of the token
    # still on the device (-1: none); that output id reads ``PENDING`` until ``Scheduler.fill``.
    pending_row: int = -1
    # Output tokens the program has seen (``LMBackend``): the next token's position, for
    # ``Program.allowed_row``, is this many plus those still in flight.
    num_program_tokens: int = 0
    # Programs that choose each decode row's input (input streaming: the next text token) set
    # it here; None feeds the last output token, as a plain LM does.
    next_input: int | None = None
    # A paused sequence (its program has no input for the next position yet: the text ran out
    # on a stream that has not ended) keeps its pages and slot but takes no decode rows.
    is_paused: bool = False
    # KV tokens reserved at admission; None reserves every token the sequence can ever hold
    # (prompt + max_tokens). A sequence with a reservation gets further pages as it grows.
    reserve_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("a sequence needs at least one prompt token")

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        return self.num_computed_tokens < len(self.prompt_ids)

    @property
    def max_num_tokens(self) -> int:
        """Most tokens this sequence can ever hold in the KV cache."""
        return len(self.prompt_ids) + self.params.max_tokens

    @property
    def num_reserved_tokens(self) -> int:
        """KV tokens admission reserves: all it can ever hold, or ``reserve_tokens`` (then it
        grows page by page)."""
        if self.reserve_tokens is None:
            return self.max_num_tokens
        return min(self.max_num_tokens, max(self.reserve_tokens, len(self.prompt_ids) + 1))

    def token_slice(self, start: int, stop: int) -> list[int]:
        """``(prompt_ids + output_ids)[start:stop]`` without building the whole list."""
        n = len(self.prompt_ids)
        if stop <= n:
            return self.prompt_ids[start:stop]
        if start >= n:
            return self.output_ids[start - n : stop - n]
        return self.prompt_ids[start:] + self.output_ids[: stop - n]
