"""Continuous-batching scheduler: moves sequences between queues; holds no tensors.

Its policy (admission with every page reserved, earliest deadline first, decodes before
prefill, the decode cap and horizon, prompts waiting for company) is what callers depend on:
docs/orpheus.md, "How the engine schedules".
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from engine.backend import JobError
from engine.llm.page_allocator import PageAllocator, num_pages_for
from engine.llm.sequence import PENDING, Sequence, SequenceStatus

__all__ = ["LIGHT_SLACK_S", "RequestError", "ScheduledBatch", "Scheduler", "SchedulerConfig", "check_token_buckets",
           "parse_token_buckets"]


class RequestError(Exception):
    """A job cannot be accepted; ``error`` is what the job's stream is told."""

    def __init__(self, error: JobError) -> None:
        super().__init__(error.message)
        self.error = error


# Light steps run while no playing row is due within this many seconds: 0.05 took Kyutai TTS's
# 400 streams from a TTFA p50 of 375 to 267 ms (p90 503 to 400) on one H200 and gave 271 / 457
# and 242 / 366 on two others, every stream on time (docs/performance.md); 0.1 before.
LIGHT_SLACK_S = 0.05


def check_token_buckets(counts: tuple[int, ...]) -> None:
    """Refuse prefill graph token counts (the prompt passes' padded sizes: EngineConfig's, a
    program's ServingDefaults') that are not increasing whole numbers >= 1."""
    if any(c < 1 for c in counts) or list(counts) != sorted(set(counts)):
        raise ValueError("prefill_token_buckets must be token counts >= 1 in increasing order, "
                         f"got {','.join(map(str, counts))}")


def parse_token_buckets(text: str) -> tuple[int, ...]:
    """``"32,64,192"`` -> (32, 64, 192), checked by ``check_token_buckets``; ValueError otherwise."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"expected token counts separated by commas, got {text!r}") from None
    check_token_buckets(counts)
    return counts


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int = 4096
    max_waiting: int = 256
    # Prefill rows per step (0 = no limit); a CUDA-graph runner packs at most this many prompts.
    max_num_prefill_seqs: int = 0
    # Prefill tokens per step (0 = what the token budget leaves); with prefill graphs, their
    # largest token bucket.
    max_num_prefill_tokens: int = 0
    # Decode rows per step (0 = every running sequence). Above it, the earliest deadlines
    # decode and the others wait a step (holding their pages): set it to the largest batch whose
    # step still keeps real time, and segments generated ahead only use what is left.
    max_num_decode_seqs: int = 0
    # True: a prompt is split across steps only when it cannot fit a step on its own; one that
    # does not fit what is left of this step's budget waits for the next step (whole fresh
    # prompts can be replayed from a graph, chunks cannot).
    whole_prompts: bool = False
    # Seconds ahead of now within which a deadline makes a decode run this step (0 = off), and
    # the rows decoded anyway, earliest deadlines first, while fewer than that are due.
    decode_horizon_s: float = 0.0
    decode_fill_seqs: int = 0
    # Fresh prompts wait up to this long (once due) for prefill_batch_seqs of them to share one
    # prefill pass, while the step has at least decode_fill_seqs decode rows (0 = off).
    prefill_wait_s: float = 0.0
    prefill_batch_seqs: int = 0
    # True: while the step has at least decode_fill_seqs decode rows, fresh prompts not due
    # within the decode horizon wait (a segment generated ahead is prefilled once it is due, or
    # when the step has room), so a burst of starts pays for the prompts that are needed now.
    hold_undue_prompts: bool = False
    # Light steps (0 = off): rows that have generated fewer than light_until_step tokens (a head
    # whose first steps of a sequence run a cheaper step variant: ``TokenHead.light_until_step``)
    # take up to light_steps_max steps in a row of their own, at most light_max_rows of them,
    # while no other due row of a playing stream is due within light_slack_s; then a step of
    # every due row. A new sequence's first steps then wait for cheap steps, not whole loaded ones.
    # (A row whose deadline is a first-audio target, not a playing client's, never stops them:
    # at 40 new streams a second each would, for the steps between its light ones and its audio.)
    light_steps_max: int = 0
    light_until_step: int = 0
    light_max_rows: int = 16
    light_slack_s: float = LIGHT_SLACK_S

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                "max_num_batched_tokens must be >= max_num_seqs (every running sequence decodes "
                f"each step), got {self.max_num_batched_tokens} < {self.max_num_seqs}"
            )
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be >= 0, got {self.max_waiting}")
        if self.max_num_prefill_seqs < 0:
            raise ValueError(f"max_num_prefill_seqs must be >= 0, got {self.max_num_prefill_seqs}")
        if self.max_num_prefill_tokens < 0:
            raise ValueError(f"max_num_prefill_tokens must be >= 0, got {self.max_num_prefill_tokens}")
        if self.max_num_decode_seqs < 0:
            raise ValueError(f"max_num_decode_seqs must be >= 0, got {self.max_num_decode_seqs}")
        if not self.decode_horizon_s >= 0.0:  # (also refuses NaN)
            raise ValueError(f"decode_horizon_s must be >= 0, got {self.decode_horizon_s}")
        if self.decode_fill_seqs < 0:
            raise ValueError(f"decode_fill_seqs must be >= 0, got {self.decode_fill_seqs}")
        if not self.prefill_wait_s >= 0.0:
            raise ValueError(f"prefill_wait_s must be >= 0, got {self.prefill_wait_s}")
        if self.prefill_batch_seqs < 0:
            raise ValueError(f"prefill_batch_seqs must be >= 0, got {self.prefill_batch_seqs}")
        if self.light_steps_max < 0 or self.light_until_step < 0 or self.light_max_rows < 1:
            raise ValueError("light_steps_max and light_until_step must be >= 0, light_max_rows >= 1")
        if not self.light_slack_s >= 0.0:
            raise ValueError(f"light_slack_s must be >= 0, got {self.light_slack_s}")


@dataclass
class ScheduledBatch:
    """One step's work: decodes first (one new token each), then prefill chunks.

    ``is_sampled[i]`` is true when row i's chunk reaches its last token, so its sample is kept.
    """

    seqs: list[Sequence]
    num_new_tokens: list[int]
    is_sampled: list[bool]
    num_decode_seqs: int
    num_deferred_decodes: int = 0  # decodes that skipped this step (cap, horizon)
    is_light: bool = False  # its decode rows are light rows alone (``SchedulerConfig.light_steps_max``)
    output_index: list[int] = field(default_factory=list)  # per row, its output id's index (advance)

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


def _by_deadline(seq: Sequence) -> float:
    return seq.deadline_s


class Scheduler:
    def __init__(self, config: SchedulerConfig, allocator: PageAllocator, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        capacity = allocator.num_pages * allocator.page_size
        if capacity < config.max_model_len:
            raise ValueError(
                f"KV cache holds {capacity} tokens, fewer than max_model_len={config.max_model_len}"
            )
        self.config = config
        self.allocator = allocator
        self._clock = clock  # the deadlines' clock (the engine core's)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._free_slots = list(range(config.max_num_seqs - 1, -1, -1))
        self._live: dict[int, Sequence] = {}  # waiting and running, by seq_id
        self._is_waiting_sorted = True
        self._num_paused = 0  # running sequences with is_paused set
        self._num_growing = 0  # running sequences with a reservation (they take pages as they grow)
        self.num_page_waits = 0  # decodes skipped because no page was free to grow into
        self._light_run = 0  # light steps in a row (``SchedulerConfig.light_steps_max``)
        self.num_light_steps = 0  # steps that ran light rows alone

    def set_deadline(self, seq_id: int, deadline_s: float, *, first_audio: bool = False) -> Sequence | None:
        """When this sequence's next audio is needed (unknown or finished ids are ignored;
        ``first_audio``: a first-audio target); the sequence, or None."""
        seq = self._live.get(seq_id)
        if seq is None:
            return None
        seq.deadline_s = deadline_s
        seq.awaits_first_audio = first_audio
        if seq.status is SequenceStatus.WAITING:
            self._is_waiting_sorted = False
        return seq

    def now(self) -> float:
        """The deadlines' clock."""
        return self._clock()

    # -- queues ---------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a sequence (capping max_tokens to the context); raises ``RequestError``."""
        limit = self.config.max_model_len
        if seq.num_prompt_tokens >= limit:
            raise RequestError(
                JobError(
                    "too_long",
                    f"prompt of {seq.num_prompt_tokens} tokens does not fit the model context "
                    f"of {limit} tokens; split the text into shorter segments",
                    retryable=False,
                )
            )
        if seq.max_num_tokens > limit:
            seq.params = replace(seq.params, max_tokens=limit - seq.num_prompt_tokens)
        self._admit()
        admits_now = not self.waiting and self._can_admit(seq)
        if len(self.waiting) >= self.config.max_waiting and not admits_now:
            raise RequestError(
                JobError(
                    "capacity",
                    f"engine at capacity: {len(self.running)} running, "
                    f"{len(self.waiting)} waiting (max_waiting={self.config.max_waiting})",
                    retryable=True,
                )
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        self._live[seq.seq_id] = seq
        self._is_waiting_sorted = False
        self._admit()

    def abort(self, seq_id: int) -> Sequence | None:
        """Remove a sequence wherever it is and free its pages; None if unknown (idempotent)."""
        for seq in self.waiting:
            if seq.seq_id == seq_id:
                self.waiting.remove(seq)
                self._live.pop(seq_id, None)
                seq.status = SequenceStatus.FINISHED
                return seq
        for seq in self.running:
            if seq.seq_id == seq_id:
                self.finish(seq)
                return seq
        return None

    def pause(self, seq: Sequence) -> None:
        """Hold a running sequence: no rows until ``resume`` (idempotent)."""
        if seq.status is SequenceStatus.RUNNING and not seq.is_paused:
            self._num_paused += 1
        seq.is_paused = True

    def resume(self, seq: Sequence) -> None:
        """Let a paused sequence decode again (idempotent)."""
        if seq.status is SequenceStatus.RUNNING and seq.is_paused:
            self._num_paused -= 1
        seq.is_paused = False

    def finish(self, seq: Sequence) -> None:
        """A running sequence is done: free its pages and slot."""
        if seq.is_paused:
            self._num_paused -= 1
            seq.is_paused = False
        if seq.reserve_tokens is not None:
            self._num_growing -= 1
        self.running.remove(seq)
        self._live.pop(seq.seq_id, None)
        self.allocator.deallocate(seq.pages)
        seq.pages = []
        self._free_slots.append(seq.slot)
        seq.slot = -1
        seq.status = SequenceStatus.FINISHED

    def has_work(self) -> bool:
        """Waiting sequences, or running ones that are not paused."""
        return bool(self.waiting) or len(self.running) > self._num_paused

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    # -- admission ------------------------------------------------------------------------

    def _can_admit(self, seq: Sequence) -> bool:
        if not self._free_slots:
            return False
        pages = num_pages_for(seq.num_reserved_tokens, self.allocator.page_size)
        if seq.reserve_tokens is not None:  # leave every growing sequence a page to grow into
            pages += self._num_growing
        return self.allocator.can_allocate(pages)

    def _admit(self) -> None:
        if not self._is_waiting_sorted:  # stable: equal deadlines keep arrival order
            self.waiting = deque(sorted(self.waiting, key=_by_deadline))
            self._is_waiting_sorted = True
        while self.waiting and self._can_admit(self.waiting[0]):
            seq = self.waiting.popleft()
            seq.pages = self.allocator.allocate(
                num_pages_for(seq.num_reserved_tokens, self.allocator.page_size)
            )
            if seq.reserve_tokens is not None:
                self._num_growing += 1
            if seq.is_paused:
                self._num_paused += 1
            seq.slot = self._free_slots.pop()
            seq.status = SequenceStatus.RUNNING
            seq.ready_s = self._clock()
            self.running.append(seq)

    # -- steps ----------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch | None:
        """Pick this step's rows (decodes first); None when nothing is running."""
        self._admit()
        if not self.running:
            return None
        budget = self.config.max_num_batched_tokens
        ready: list[Sequence] = []  # one uncomputed token: a decode
        prefills: list[Sequence] = []
        for s in self.running:  # (one pass, no property calls: 256-512 sequences every step)
            num_outputs = len(s.output_ids)
            uncomputed = len(s.prompt_ids) + num_outputs - s.num_computed_tokens
            if uncomputed == 1:
                # (a sequence whose last allowed token is in flight is done, whatever that token is)
                if num_outputs < s.params.max_tokens and not s.is_paused:
                    ready.append(s)
            elif uncomputed > 1:
                prefills.append(s)
        decodes = self._pick_decodes(ready)
        if self._num_growing:
            decodes = self._grow(decodes)
        if prefills and self.config.hold_undue_prompts:
            prefills = self._due_prompts(len(decodes), prefills)
        prefills.sort(key=_by_deadline)
        if prefills and self._prompts_wait(len(decodes), prefills):
            prefills = []
        seqs: list[Sequence] = list(decodes)
        counts = [1] * len(decodes)
        budget -= len(decodes)
        cfg = self.config
        if cfg.max_num_prefill_tokens:
            budget = min(budget, cfg.max_num_prefill_tokens)
        whole_limit = budget  # the most prompt tokens a step with these decodes takes
        for seq in prefills:
            if budget <= 0 or (cfg.max_num_prefill_seqs and len(seqs) - len(decodes) >= cfg.max_num_prefill_seqs):
                break
            n = min(seq.num_uncomputed_tokens, budget)
            if (cfg.whole_prompts and n < seq.num_uncomputed_tokens and len(seqs) > len(decodes)
                    and seq.num_uncomputed_tokens <= whole_limit):
                break  # fits a later step whole: wait (earliest deadline first is kept)
            seqs.append(seq)
            counts.append(n)
            budget -= n
        sampled = [s.num_computed_tokens + n == s.num_tokens for s, n in zip(seqs, counts)]
        return ScheduledBatch(seqs, counts, sampled, num_decode_seqs=len(decodes),
                              num_deferred_decodes=len(ready) - len(decodes), is_light=self._light_run > 0)

    def _pick_decodes(self, decodes: list[Sequence]) -> list[Sequence]:
        """This step's decode rows: the cap and the horizon, earliest deadlines first (stable:
        ties keep running order); then, with light steps, the light rows alone when they may."""
        rows = self._due_decodes(decodes)
        return self._light_rows(rows) if self.config.light_steps_max else rows

    def _due_decodes(self, decodes: list[Sequence]) -> list[Sequence]:
        cfg = self.config
        cap = cfg.max_num_decode_seqs or len(decodes)
        if cfg.decode_horizon_s <= 0.0:
            return decodes if len(decodes) <= cap else sorted(decodes, key=_by_deadline)[:cap]
        keep = max(1, min(cfg.decode_fill_seqs, cap))
        if len(decodes) <= keep:
            return decodes
        ordered = sorted(decodes, key=_by_deadline)
        no_deadline = bisect.bisect_left(ordered, math.inf, key=_by_deadline)  # they sort last
        due = bisect.bisect_right(ordered, self._clock() + cfg.decode_horizon_s, hi=no_deadline, key=_by_deadline)
        rows = ordered[:due] + ordered[no_deadline:]  # a job without a deadline is always due
        if len(rows) < keep:
            rows += ordered[due:no_deadline][:keep - len(rows)]
        return rows[:cap]

    def _light_rows(self, rows: list[Sequence]) -> list[Sequence]:
        """``rows``, or its light rows alone (``SchedulerConfig.light_steps_max``): when some
        rows are light and some not, fewer than light_steps_max light steps ran just before,
        and no other row of a playing stream is due within light_slack_s. Earliest deadlines
        first."""
        cfg = self.config
        light = [s for s in rows if s.num_output_tokens < cfg.light_until_step]
        if not light or len(light) == len(rows) or self._light_run >= cfg.light_steps_max:
            self._light_run = 0
            return rows
        soon = self._clock() + cfg.light_slack_s
        if any(s.deadline_s < soon and not s.awaits_first_audio for s in rows
               if s.num_output_tokens >= cfg.light_until_step):
            self._light_run = 0
            return rows
        self._light_run += 1
        self.num_light_steps += 1
        if len(light) > cfg.light_max_rows:
            light = sorted(light, key=_by_deadline)[:cfg.light_max_rows]
        return light

    def _grow(self, decodes: list[Sequence]) -> list[Sequence]:
        """Give each decode row whose next token starts a page that page; rows that find none
        free skip the step (counted in ``num_page_waits``)."""
        ps = self.allocator.page_size
        kept = []
        for s in decodes:
            if s.reserve_tokens is not None and s.num_computed_tokens >= len(s.pages) * ps:
                if not self.allocator.can_allocate(1):
                    self.num_page_waits += 1
                    continue
                s.pages.extend(self.allocator.allocate(1))
            kept.append(s)
        return kept

    def _is_busy(self, num_decodes: int) -> bool:
        """A step with at least the fill count of decode rows: prompts may be held back."""
        return num_decodes >= max(self.config.decode_fill_seqs, 1)

    @staticmethod
    def _is_due(seq: Sequence, limit: float) -> bool:
        """Due by ``limit`` (a job without a deadline always is)."""
        return seq.deadline_s <= limit or seq.deadline_s == math.inf

    def _due_prompts(self, num_decodes: int, prefills: list[Sequence]) -> list[Sequence]:
        """``hold_undue_prompts``: under load, only the prompts due within the horizon (and
        chunks under way, and jobs without a deadline)."""
        cfg = self.config
        if cfg.decode_horizon_s <= 0.0 or not self._is_busy(num_decodes):
            return prefills
        limit = self._clock() + cfg.decode_horizon_s
        return [s for s in prefills if s.num_computed_tokens > 0 or self._is_due(s, limit)]

    def _prompts_wait(self, num_decodes: int, prefills: list[Sequence]) -> bool:
        """True when this step's fresh prompts should wait for more (``prefill_wait_s``)."""
        cfg = self.config
        if cfg.prefill_wait_s <= 0.0 or not self._is_busy(num_decodes):
            return False
        if cfg.prefill_batch_seqs and len(prefills) >= cfg.prefill_batch_seqs:
            return False
        now = self._clock()
        horizon = now + cfg.decode_horizon_s if cfg.decode_horizon_s > 0.0 else math.inf
        for seq in prefills:
            if seq.num_computed_tokens > 0:  # a chunked prompt under way goes on
                return False
            if self._is_due(seq, horizon) and now - seq.ready_s >= cfg.prefill_wait_s:
                return False
        return True

    def update(self, batch: ScheduledBatch, tokens: list[int]) -> list[tuple[Sequence, int]]:
        """Record a step's results; returns (sequence, new token) for every sampled row."""
        self.advance(batch)
        return self.fill(batch, tokens)

    def advance(self, batch: ScheduledBatch) -> None:
        """A launched step's progress, before its tokens are known (asynchronous steps): its
        tokens count as computed and each sampled row gets a ``PENDING`` output id (its row:
        ``Sequence.pending_row``), so the next step can be scheduled now; ``fill`` writes the
        tokens in."""
        index = []
        for i, (seq, n, is_sampled) in enumerate(zip(batch.seqs, batch.num_new_tokens, batch.is_sampled)):
            seq.num_computed_tokens += n
            if is_sampled:
                index.append(len(seq.output_ids))
                seq.output_ids.append(PENDING)
                seq.pending_row = i
            else:
                index.append(-1)
        batch.output_index = index

    def fill(self, batch: ScheduledBatch, tokens: list[int]) -> list[tuple[Sequence, int]]:
        """An advanced step's tokens; returns (sequence, new token) for every sampled row."""
        new: list[tuple[Sequence, int]] = []
        for seq, i, tok in zip(batch.seqs, batch.output_index, tokens):
            if i >= 0:
                seq.output_ids[i] = int(tok)
                if seq.output_ids[-1] != PENDING:  # (a later step's token may still be pending)
                    seq.pending_row = -1
                new.append((seq, int(tok)))
        return new
