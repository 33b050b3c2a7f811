"""The word-feeding state machine of Kyutai TTS, on the host (moshi 0.2.13's ``tts.StateMachine``).

``HostMachine`` runs it over entries that may still grow and replays the device's machine from
the sampled tokens; ``ready_to_run(n)`` says when a row may run without changing its tokens
(docs/models/kyutai_tts.md, "The state machine" and "Pauses").
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field

__all__ = ["NEW_WORD", "MAIN", "OTHER", "PAD", "ZERO", "Entry", "MachineParams", "HostMachine"]

NEW_WORD, MAIN, OTHER, PAD = 0, 1, 2, 3  # text-stream specials (moshi ``TokenIds``)
ZERO = -1  # an input that embeds to exactly zero


@dataclass(frozen=True)
class Entry:
    """One word to speak (its tokens), or a pause (no tokens: ``padding`` frames of silence)."""

    tokens: tuple[int, ...]
    padding: int = 0
    text: str = ""


@dataclass(frozen=True)
class MachineParams:
    card: int  # the multiplexing stride: text_card + 1
    second_stream_ahead: int = 2
    max_padding: int = 8
    initial_padding: int = 2


@dataclass
class HostMachine:
    params: MachineParams
    entries: list[Entry] = field(default_factory=list)  # every entry received so far
    final: bool = False  # no more entries will come
    next_entry: int = 0
    queued: deque[int] = field(default_factory=deque)
    lookahead: deque[int] = field(default_factory=deque)
    remaining_padding: int = 0
    forced_padding: int = 0
    end_step: int | None = None
    consumption_times: list[int] = field(default_factory=list)
    transcript: list[tuple[str, int]] = field(default_factory=list)
    steps: int = 0  # frames processed

    def __post_init__(self) -> None:
        if not self.steps:
            self.remaining_padding = self.forced_padding = self.params.initial_padding

    def add(self, entries: list[Entry], *, final: bool = False) -> None:
        if self.final and entries:
            raise ValueError("entries added after the final one")
        self.entries.extend(entries)
        self.final = self.final or final

    @property
    def num_words(self) -> int:
        return sum(1 for e in self.entries if e.tokens)

    def _tokens_ahead(self, start: int) -> list[int]:
        """The tokens of the ``second_stream_ahead``-th word among entries[start:] ([] if none)."""
        n = self.params.second_stream_ahead
        entries = self.entries
        for i in range(start, len(entries)):  # (not a slice: that copies every entry left, each call)
            e = entries[i]
            if e.tokens:
                n -= 1
                if n == 0:
                    return list(e.tokens)
        return []

    def _ready_to_pop(self) -> bool:
        """Entries are there for the next pop: the entry itself and, for a word, the one its
        look-ahead reads (or the text has ended)."""
        if self.final:
            return True
        e = self.next_entry
        if e >= len(self.entries):
            return False
        if not self.entries[e].tokens or not self.params.second_stream_ahead:
            return True
        return len(self._tokens_ahead(e + 1)) > 0

    def _decide(self, token: int) -> bool:
        """Whether this frame is a word frame given the sampled token (before popping)."""
        if self.queued or self.forced_padding > 0:
            return False
        if self.remaining_padding <= 0:
            return True
        return token == NEW_WORD

    def step(self, token: int) -> int:
        """The sampled text token of frame ``self.steps`` -> the next frame's text input."""
        p, step = self.params, self.steps
        word = self._decide(token)
        if word:
            if self.next_entry < len(self.entries):
                entry = self.entries[self.next_entry]
                self.next_entry += 1
                self.consumption_times.append(step)
                if entry.tokens:
                    self.transcript.append((entry.text, step))
                    self.queued.extend(entry.tokens)
                    if p.second_stream_ahead:
                        self.lookahead.extend(self._tokens_ahead(self.next_entry))
                    self.remaining_padding = p.max_padding
                else:
                    word = False  # a pause entry: this frame pads
                self.forced_padding = entry.padding
            else:
                if not self.final:
                    raise RuntimeError("HostMachine.step popped past the entries received (check ready_to_run)")
                word = bool(p.second_stream_ahead) and self.end_step is None
                if self.end_step is None:
                    self.end_step = step
        if word:
            out = NEW_WORD
        else:
            if self.remaining_padding > 0:
                self.remaining_padding -= 1
            if self.forced_padding > 0:
                self.forced_padding -= 1
            out = self.queued.popleft() if self.queued else PAD
        if p.second_stream_ahead:
            # As the reference: any first token equal to NEW_WORD moves to the second stream (a
            # word token with id 0, SentencePiece's <unk>, included).
            second = -1
            if out == NEW_WORD:
                second = NEW_WORD
                out = self.queued.popleft() if self.queued else PAD
            elif self.lookahead:
                second = self.lookahead.popleft()
            out = (second + 1) * p.card + out
        self.steps += 1
        return out

    def _clone(self) -> HostMachine:
        """A copy for look-ahead simulation: shares the (unchanged) entries, not the logs."""
        c = copy.copy(self)
        c.queued, c.lookahead = deque(self.queued), deque(self.lookahead)
        c.consumption_times, c.transcript = [], []
        return c

    def ready_to_run(self, num_steps: int) -> bool:
        """Whether the next ``num_steps`` frames can run whatever the model samples, without
        popping an entry that is not ready (see ``_ready_to_pop``)."""
        if num_steps <= 0 or self.final:
            return True  # (after the text's end every pop is ready)
        if self._enough_entries(num_steps):
            return True  # the common case, checked without the search: text is there ahead
        return self._ready(num_steps, set())

    def _enough_entries(self, num_steps: int) -> bool:
        """Whether every pop the next ``num_steps`` frames could make is ready however they go: a
        frame pops at most one entry, so they pop from ``entries[next_entry : next_entry +
        num_steps]`` only, and each pop's look-ahead word comes no later than the
        ``second_stream_ahead``-th word after that range, if it has arrived."""
        end = self.next_entry + num_steps
        if end > len(self.entries):
            return False
        if not self.params.second_stream_ahead:
            return True
        return len(self._tokens_ahead(end)) > 0

    def _ready(self, n: int, seen: set) -> bool:
        if n <= 0:
            return True
        key = (self.next_entry, len(self.queued), self.remaining_padding, self.forced_padding, n)
        if key in seen:
            return True
        seen.add(key)
        for token in (NEW_WORD, PAD):
            if self._decide(token) and not self._ready_to_pop():
                return False
            nxt = self._clone()
            nxt.step(token)
            if not nxt._ready(n - 1, seen):
                return False
            if not self._decide(NEW_WORD) or self._decide(PAD):  # the sample does not matter here
                break
        return True
