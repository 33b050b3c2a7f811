"""The program contract: what the model-agnostic LM runtime asks of a model.

A program (``models/<name>/program.py``) turns text into prompt ids, says how generated tokens
become audio, and owns whatever state a sequence needs for that. It never sees jobs, streams or
batches of requests: the backend hands it one sequence's state per row. The runtime
(``engine.llm``) never looks inside a model; ``docs/adding_a_model.md`` explains the hooks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from engine.backend import BackendInfo
from engine.llm.sequence import SamplingParams

__all__ = ["Collect", "Program"]

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

    def launch_postprocess(self, states: list[Any], tokens: list[int]) -> Collect:
        """One generated (non-stop) token per row: its bookkeeping now, its audio started;
        ``collect()`` gives the new audio per row (None if none)."""
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
