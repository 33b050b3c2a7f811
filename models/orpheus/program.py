"""The Orpheus program: what turns text into Orpheus prompt ids and its tokens into SNAC audio.

``OrpheusProgram`` restricts the head to each position's codebook ids + stop, and decodes a
step's completed frames in one batched call (``decode_fn``, or the stateful ``stream_codec``
after a segment's fast-start frames): docs/orpheus.md, "Codec".
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.backend import BackendInfo
from engine.llm.program import Collect
from engine.llm.sequence import SamplingParams

__all__ = ["FAST_START_WITHIN_S", "LOADED_FRAME_INTERVAL_S", "OrpheusProgram", "OrpheusState"]


# Frames slower than this start new segments on the loaded ramp: the default ramp (half frames
# 2-4) keeps a 100 ms start-up buffer fed up to about 76 ms per frame (a player replayed over
# constant frame intervals), but frames vary around the average: at 128 streams on the H200
# the average frame took 43 ms (6.2 ms steps) and 7 of 154 streams still underran at their
# 5th chunk, with frames of 57-77 ms while many streams started at once. Under light load (a
# lone stream: 26 ms frames) the default ramp starts playback a frame sooner.
LOADED_FRAME_INTERVAL_S = 0.035
# A segment whose first audio is due later than this (a segment generated ahead of the one
# being spoken, or one that starts while its stream's client holds that much audio) skips the
# window decoder's fast-start ramp: the stateful codec alone gives its audio a few frames later
# (its fixed delay, frames 1-4), which nobody waits for. Under load most segments are such:
# on the H200 the ramp's float32 window decodes took about 4 ms of kernel time per step at 512
# streams (docs/performance_history.md run 27). Four frames take about 0.35 s to generate at 12 ms steps.
FAST_START_WITHIN_S = 0.5
_STEP_EMA = 0.1  # weight of the newest step interval in the moving average
_LOAD_STALE_S = 1.0  # no step reported for this long: the engine went idle, the load is gone


@dataclass
class OrpheusState:
    """Per-sequence postprocessing state."""

    decoder: Any  # models.orpheus.codec.StreamingDecoder (without a codec of its own)
    num_audio_tokens: int = 0
    frame: list[int] = field(default_factory=list)  # codes of the frame being built
    # Stateful codec only: its slot (-1: none yet / released), its cursor, samples emitted so
    # far, and whether the window decoder's fast-start ramp still serves this stream.
    slot: int = -1
    cursor: Any = None  # models.orpheus.snac_stream.StreamCursor
    num_emitted: int = 0
    in_ramp: bool = True


class OrpheusProgram:
    """Orpheus: ``"{voice}: {text}"`` prompt, audio tokens -> SNAC 24 kHz audio."""

    def __init__(
        self,
        tokenizer: Any,
        codec: Any,
        *,
        model_name: str = "orpheus",
        constrain_positions: bool = True,
        window_frames: int | None = None,
        lookahead_samples: int | None = None,
        first_lookahead_samples: int | None = 1024,
        ramp_step_samples: int | None = None,
        loaded_ramp_step_samples: int | None = None,
        decode_fn: Callable[[list[Any]], list[np.ndarray]] | None = None,
        stream_codec: Any = None,
        seed_rng: random.Random | None = None,
    ) -> None:
        """``codec`` is a ``models.orpheus.codec.SnacDecoder``; ``decode_fn(requests)`` decodes
        a batch of ``WindowRequest`` s (default: ``decode_requests(codec, requests)``).

        With ``constrain_positions`` the k-th audio token may only be one of the 4096 ids of
        its frame position (and stop only at a frame boundary); the model was trained to emit
        exactly these, so this only removes ids that would be undecodable.

        ``first_lookahead_samples`` (default 1024) starts each segment's audio after its first
        frame instead of its third (``StreamingDecoder``'s fast-start ramp; the first 171 ms are
        decoded with less right context); ``None`` keeps the decoder exact from the first sample.
        ``ramp_step_samples``: the ramp's lookahead growth per frame (default 1024,
        ``StreamingDecoder``). ``loaded_ramp_step_samples``: the growth for segments that start
        while frames take longer than ``LOADED_FRAME_INTERVAL_S`` (7 x the engine's recent step
        interval, ``note_step_interval``); None keeps ``ramp_step_samples`` always. Under load
        the default ramp's half frames drain a player's start-up buffer faster than real-time
        frames refill it; a steeper ramp starts playback a frame later with that deficit
        behind it (docs/orpheus.md).
        """
        from models.orpheus import codec as codec_mod
        from models.orpheus import prompt, tokens

        self._prompt = prompt
        self._tokens = tokens
        self._codec_mod = codec_mod
        self.tokenizer = tokenizer
        self.codec = codec
        self.decode_fn = decode_fn or (lambda reqs: codec_mod.decode_requests(codec, reqs))
        self.stream_codec = stream_codec
        self._free_slots: list[int] = []
        if stream_codec is not None:
            self._free_slots = list(range(stream_codec.snac.max_streams - 1, -1, -1))
            self._delay = int(stream_codec.snac.delay_samples)
        self._codec_stream = None
        if stream_codec is not None and stream_codec.device.type == "cuda":
            self._codec_stream = torch.cuda.Stream(stream_codec.device)
        self._decoder_kw = {
            "window_frames": window_frames or codec_mod.DEFAULT_WINDOW_FRAMES,
            "lookahead_samples": codec_mod.DEFAULT_LOOKAHEAD_SAMPLES if lookahead_samples is None
            else lookahead_samples,
            "first_lookahead_samples": None if first_lookahead_samples is None else min(
                first_lookahead_samples, lookahead_samples or codec_mod.DEFAULT_LOOKAHEAD_SAMPLES),
            "ramp_step_samples": ramp_step_samples or codec_mod.DEFAULT_RAMP_STEP_SAMPLES,
        }
        self._loaded_decoder_kw = None if loaded_ramp_step_samples is None else dict(
            self._decoder_kw, ramp_step_samples=loaded_ramp_step_samples)
        self._step_interval_s = 0.0  # moving average of note_step_interval
        self._totals = {"codec_frames": 0, "window_decodes": 0}  # counters since start (totals)
        self._t_noted = -math.inf  # when it was last reported (self._clock)
        self._clock = time.monotonic
        self.stop_ids = frozenset({prompt.STOP_ID})
        self.vocab_ids = tokens.audio_token_ids()  # [K] = 7*4096 audio ids, then STOP_ID
        self.allowed_table = self._position_table() if constrain_positions else None
        self._seed_rng = seed_rng or random.Random()
        ranges = {
            name: {"min": lo, "max": hi, "min_inclusive": inc, "default": prompt.DEFAULT_OPTIONS[name]}
            for name, (lo, hi, inc) in prompt.OPTION_RANGES.items()
        }
        ranges["seed"] = {"min": 0, "max": 2**63 - 1, "default": None}
        self.info = BackendInfo(
            model=model_name,
            voices=tuple(prompt.VOICES),
            default_voice=prompt.DEFAULT_VOICE,
            sample_rate=24000,
            options=ranges,
            # one token per decode row; 7 tokens make a frame of 2,048 samples: 82.03 per second
            tokens_per_audio_second=tokens.TOKENS_PER_FRAME * 24000 / tokens.SAMPLES_PER_FRAME,
        )

    def _position_table(self) -> torch.Tensor:
        t = self._tokens
        k = int(self.vocab_ids.numel())
        table = torch.zeros(t.TOKENS_PER_FRAME, k, dtype=torch.bool)  # [7, K]
        for p in range(t.TOKENS_PER_FRAME):
            table[p, p * t.CODEBOOK_SIZE : (p + 1) * t.CODEBOOK_SIZE] = True
        table[0, k - 1] = True  # STOP_ID is the last column; allowed between frames only
        return table

    # -- jobs -----------------------------------------------------------------------------

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return self._prompt.validate_options(voice, options)

    def build_prompt(self, text: str, voice: str, options: dict[str, Any]) -> list[int]:
        return self._prompt.build_prompt_ids(self.tokenizer, voice, text)

    def sampling_params(self, options: dict[str, Any]) -> SamplingParams:
        d = self._prompt.DEFAULT_OPTIONS
        seed = options.get("seed")
        return SamplingParams(
            temperature=float(options.get("temperature", d["temperature"])),
            top_p=float(options.get("top_p", d["top_p"])),
            repetition_penalty=float(options.get("repetition_penalty", d["repetition_penalty"])),
            seed=self._seed_rng.getrandbits(63) if seed is None else int(seed),
            max_tokens=int(options.get("max_tokens", d["max_tokens"])),
        )

    def new_state(self, voice: str, options: dict[str, Any]) -> OrpheusState:
        kw = self._decoder_kw
        if (self._loaded_decoder_kw is not None and self.frame_interval_s > LOADED_FRAME_INTERVAL_S
                and self._clock() - self._t_noted < _LOAD_STALE_S):
            kw = self._loaded_decoder_kw
        return OrpheusState(decoder=self._codec_mod.StreamingDecoder(None, **kw))

    def totals(self) -> dict[str, int]:
        """Counters since start: frames through the stateful codec, windows decoded (ramp), and
        the stateful codec's replayed rows (its batch buckets: frames and flush rows plus padding)."""
        out = dict(self._totals)
        replayed = getattr(self.stream_codec, "rows_replayed", None)
        if replayed is not None:
            out["codec_rows_replayed"] = int(replayed)
        return out

    def note_step_interval(self, seconds: float) -> None:
        self._step_interval_s += _STEP_EMA * (seconds - self._step_interval_s)
        self._t_noted = self._clock()

    @property
    def frame_interval_s(self) -> float:
        """How long a frame (7 tokens) takes at the recent step rate."""
        return self._step_interval_s * self._tokens.TOKENS_PER_FRAME

    def allowed_row(self, state: OrpheusState, ahead: int = 0) -> int:
        return (state.num_audio_tokens + ahead) % self._tokens.TOKENS_PER_FRAME

    # -- tokens -> audio ------------------------------------------------------------------
    #
    # Each entry point comes in two halves: ``launch_*`` does the host bookkeeping at once
    # (codes, frames, positions: what the next step's scheduling needs) and starts the codec's
    # device work without waiting for it; the returned ``collect()`` waits and gives the audio.
    # The backend collects a step's audio while the GPU runs the next step. ``postprocess`` and
    # ``finish`` are both halves at once.

    def postprocess(self, states: list[OrpheusState], tokens: list[int]) -> list[np.ndarray | None]:
        """One generated (non-stop) token per row -> new audio per row (None if none)."""
        return self.launch_postprocess(states, tokens)()

    def finish(self, states: list[OrpheusState]) -> list[np.ndarray | None]:
        """These sequences ended: each one's remaining audio."""
        return self.launch_finish(states)()

    def launch_postprocess(self, states: list[OrpheusState], tokens: list[int]) -> Collect:
        """Map each row's token to a code; start decoding every frame that completed.

        A token that is not an audio id valid at its position (only possible without the
        position constraint) is skipped and does not advance the position.
        """
        rows: list[int] = []
        requests: list[Any] = []
        done: list[tuple[int, OrpheusState, list[int]]] = []  # rows that completed a frame
        for i, (state, tok) in enumerate(zip(states, tokens)):
            code = self._tokens.token_to_code(tok, state.num_audio_tokens)
            if code is None:
                continue
            state.num_audio_tokens += 1
            state.frame.append(code)
            if len(state.frame) == self._tokens.TOKENS_PER_FRAME:
                frame, state.frame = state.frame, []
                if self.stream_codec is not None:
                    done.append((i, state, frame))
                    continue
                req = state.decoder.push_frame(frame)
                if req is not None:
                    rows.append(i)
                    requests.append(req)
        with self._on_codec_stream():
            if self.stream_codec is None:
                return self._launch_windows(len(states), rows, requests)
            return self._launch_frames(len(states), done)

    def launch_finish(self, states: list[OrpheusState]) -> Collect:
        """The sequences ended: start decoding each one's tail against its true end.

        An incomplete last frame (stop is only possible between frames with the position
        constraint; max_tokens may cut one) is dropped: it cannot be decoded. Codec slots are
        given back at once (later users of a slot are queued behind this work on the device).
        """
        rows: list[int] = []
        requests: list[Any] = []
        flushing: list[int] = []
        for i, state in enumerate(states):
            state.frame = []
            if self.stream_codec is not None and not state.in_ramp:
                if state.cursor is None:  # ended before its first frame (no ramp): no audio
                    continue
                state.cursor.finish()
                flushing.append(i)
                continue
            req = state.decoder.finish()
            self.release(state)
            if req is not None:
                rows.append(i)
                requests.append(req)
        with self._on_codec_stream():
            windows = self._launch_windows(len(states), rows, requests)
            tails = self._launch_flush([states[i] for i in flushing]) if flushing else None

        def collect() -> list[np.ndarray | None]:
            out = windows()
            if tails is not None:
                for k, pcm in tails().items():
                    out[flushing[k]] = pcm
            return out

        return collect

    def note_due(self, state: OrpheusState, due_in_s: float) -> None:
        """Before a sequence's first frame: the fast-start ramp only if its first audio is due
        within ``FAST_START_WITHIN_S`` (with the stateful codec; without it the window decoder
        makes all the audio)."""
        if self.stream_codec is not None and state.cursor is None:  # (set at its first frame)
            state.in_ramp = due_in_s <= FAST_START_WITHIN_S

    def release(self, state: OrpheusState) -> None:
        """Give the stream's codec slot back (idempotent)."""
        if state.slot >= 0:
            self._free_slots.append(state.slot)
            state.slot = -1

    # -- stateful codec ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _on_codec_stream(self) -> Iterator[None]:
        """Codec work goes to its own CUDA stream, so it can overlap the LM's next step."""
        if self._codec_stream is None:
            yield
        else:
            with torch.cuda.stream(self._codec_stream):
                yield

    def _launch_frames(self, num_rows: int, done: list[tuple[int, OrpheusState, list[int]]]) -> Collect:
        """Every completed frame through the stateful codec (one call); ramp rows also through
        the window decoder, whose output they emit while it reaches further."""
        from models.orpheus.snac_stream import StreamCursor

        spf = self._tokens.SAMPLES_PER_FRAME
        fresh: list[int] = []
        codec_rows: list[tuple[int, list[int], int]] = []
        ramp_rows: list[int] = []
        ramp_reqs: list[Any] = []
        for i, state, frame in done:
            if state.slot < 0:
                if not self._free_slots:
                    raise RuntimeError("no free codec slot (more streams than the codec's max_streams)")
                state.slot = self._free_slots.pop()
                state.cursor = StreamCursor(self._delay)
                fresh.append(state.slot)
            state.cursor.push()
            codec_rows.append((state.slot, frame, state.cursor.end_frames))
            if state.in_ramp:
                req = state.decoder.push_frame(frame)
                exact_upto = state.cursor.num_frames * spf - self._delay
                if req is not None and state.decoder.num_emitted > exact_upto:
                    state.num_emitted = state.decoder.num_emitted
                    ramp_rows.append(i)
                    ramp_reqs.append(req)
                else:  # the stateful decoder reaches further from here on (its output is contiguous)
                    state.in_ramp = False
        self.stream_codec.reset(fresh)
        self._totals["codec_frames"] += len(codec_rows)
        windows = self._launch_windows(num_rows, ramp_rows, ramp_reqs)
        audio = self.stream_codec.launch(codec_rows)
        from_window = set(ramp_rows)
        steps = [state.cursor.num_steps - 1 for _, state, _ in done]

        def collect() -> list[np.ndarray | None]:
            out = windows()
            for (i, state, _), step, pcm in zip(done, steps, audio() if done else []):
                if i not in from_window:
                    out[i] = self._take(state, pcm, step)
            return out

        return collect

    def _take(self, state: OrpheusState, pcm: np.ndarray, step: int) -> np.ndarray | None:
        """The not yet emitted real samples of one stateful step's 2048 (absolute positions)."""
        spf = self._tokens.SAMPLES_PER_FRAME
        start = step * spf - self._delay
        end = start + spf
        if state.cursor.is_finished:
            end = min(end, state.cursor.num_frames * spf)
        lo = max(state.num_emitted, start, 0)
        if lo >= end:
            return None
        state.num_emitted = end
        return pcm[lo - start : end - start]

    def _launch_flush(self, states: list[OrpheusState]) -> Callable[[], dict[int, np.ndarray]]:
        """Start the flush steps of finished streams (all together); their slots are freed."""
        spf = self._tokens.SAMPLES_PER_FRAME
        num_steps = max(st.cursor.num_flush_steps_left for st in states)
        first_steps = [st.cursor.num_steps for st in states]
        audio = self.stream_codec.launch_flush([(st.slot, st.cursor.end_frames) for st in states], num_steps)
        for st in states:
            while st.cursor.num_flush_steps_left:
                st.cursor.flush()
            self.release(st)

        def collect() -> dict[int, np.ndarray]:
            parts: dict[int, list[np.ndarray]] = {}
            for k, (st, first, pcm) in enumerate(zip(states, first_steps, audio())):
                for j in range(num_steps):
                    piece = self._take(st, pcm[j * spf : (j + 1) * spf], first + j)
                    if piece is not None:
                        parts.setdefault(k, []).append(piece)
            return {k: np.concatenate(v) for k, v in parts.items()}

        return collect

    def _launch_windows(self, num_rows: int, rows: list[int], requests: list[Any]) -> Collect:
        """Start decoding ``requests`` in one batch; row ``rows[k]`` gets ``requests[k]``'s audio.

        A ``decode_fn`` with a ``launch`` attribute (``launch(requests) -> collect()``) runs
        asynchronously; any other is called at once.
        """
        if not requests:
            return lambda: [None] * num_rows
        self._totals["window_decodes"] += len(requests)
        launch = getattr(self.decode_fn, "launch", None)
        if launch is not None:
            pending = launch(requests)
        else:
            done = self.decode_fn(requests)
            pending = lambda: done  # noqa: E731

        def collect() -> list[np.ndarray | None]:
            out: list[np.ndarray | None] = [None] * num_rows
            for i, pcm in zip(rows, pending()):
                out[i] = _as_pcm(pcm)
            return out

        return collect



def _as_pcm(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32).reshape(-1)
