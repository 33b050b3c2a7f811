"""Model programs: what turns text into prompt ids and generated tokens into audio.

A program never sees jobs, streams or batches of requests: the backend hands it one sequence's
state per row. ``OrpheusProgram`` is the first: Orpheus prompt, the head restricted to the
audio ids + stop, each audio position constrained to its codebook's ids, and audio tokens ->
SNAC codes -> a per-sequence ``StreamingDecoder``.

Codec batching seam: ``postprocess`` (and ``finish``) collect the decode window of every row
that completed a frame this step and decode them in one call to ``decode_fn`` (default
``models.orpheus.codec.decode_requests``: one batched SNAC call); a GPU build passes a
``decode_fn`` that runs the batch in a CUDA graph.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from engine.backend import BackendInfo
from engine.llm.sequence import SamplingParams

__all__ = ["OrpheusProgram", "OrpheusState", "Program"]


class Program(Protocol):
    info: BackendInfo
    stop_ids: frozenset[int]
    vocab_ids: torch.Tensor | None  # the head's columns (None: whole vocabulary)
    allowed_table: torch.Tensor | None  # bool [R, K]: per-row column masks

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]: ...

    def build_prompt(self, text: str, voice: str, options: dict[str, Any]) -> list[int]: ...

    def sampling_params(self, options: dict[str, Any]) -> SamplingParams: ...

    def new_state(self, voice: str, options: dict[str, Any]) -> Any: ...

    def allowed_row(self, state: Any) -> int: ...

    def postprocess(self, states: list[Any], tokens: list[int]) -> list[np.ndarray | None]:
        """One generated (non-stop) token per row -> new audio per row (None if none)."""
        ...

    def finish(self, states: list[Any]) -> list[np.ndarray | None]:
        """These sequences ended (stop or max_tokens): each one's remaining audio."""
        ...


@dataclass
class OrpheusState:
    """Per-sequence postprocessing state."""

    decoder: Any  # models.orpheus.codec.StreamingDecoder (without a codec of its own)
    num_audio_tokens: int = 0
    frame: list[int] = field(default_factory=list)  # codes of the frame being built


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
        decode_fn: Callable[[list[Any]], list[np.ndarray]] | None = None,
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
        """
        from models.orpheus import codec as codec_mod
        from models.orpheus import prompt, tokens

        self._prompt = prompt
        self._tokens = tokens
        self._codec_mod = codec_mod
        self.tokenizer = tokenizer
        self.codec = codec
        self.decode_fn = decode_fn or (lambda reqs: codec_mod.decode_requests(codec, reqs))
        self._decoder_kw = {
            "window_frames": window_frames or codec_mod.DEFAULT_WINDOW_FRAMES,
            "lookahead_samples": codec_mod.DEFAULT_LOOKAHEAD_SAMPLES if lookahead_samples is None
            else lookahead_samples,
            "first_lookahead_samples": None if first_lookahead_samples is None else min(
                first_lookahead_samples, lookahead_samples or codec_mod.DEFAULT_LOOKAHEAD_SAMPLES),
        }
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
        return OrpheusState(decoder=self._codec_mod.StreamingDecoder(None, **self._decoder_kw))

    def allowed_row(self, state: OrpheusState) -> int:
        return state.num_audio_tokens % self._tokens.TOKENS_PER_FRAME

    # -- tokens -> audio ------------------------------------------------------------------

    def postprocess(self, states: list[OrpheusState], tokens: list[int]) -> list[np.ndarray | None]:
        """Map each row's token to a code; decode every window that became due, in one batch.

        A token that is not an audio id valid at its position (only possible without the
        position constraint) is skipped and does not advance the position.
        """
        rows: list[int] = []
        requests: list[Any] = []
        for i, (state, tok) in enumerate(zip(states, tokens)):
            code = self._tokens.token_to_code(tok, state.num_audio_tokens)
            if code is None:
                continue
            state.num_audio_tokens += 1
            state.frame.append(code)
            if len(state.frame) == self._tokens.TOKENS_PER_FRAME:
                req = state.decoder.push_frame(state.frame)
                state.frame = []
                if req is not None:
                    rows.append(i)
                    requests.append(req)
        return self._decode_rows(len(states), rows, requests)

    def finish(self, states: list[OrpheusState]) -> list[np.ndarray | None]:
        """The sequences ended: decode each one's tail against its true end, in one batch.

        An incomplete last frame (stop is only possible between frames with the position
        constraint; max_tokens may cut one) is dropped: it cannot be decoded.
        """
        rows: list[int] = []
        requests: list[Any] = []
        for i, state in enumerate(states):
            state.frame = []
            req = state.decoder.finish()
            if req is not None:
                rows.append(i)
                requests.append(req)
        return self._decode_rows(len(states), rows, requests)

    def _decode_rows(self, num_rows: int, rows: list[int], requests: list[Any]) -> list[np.ndarray | None]:
        """Decode ``requests`` in one batch; row ``rows[k]`` gets the audio of ``requests[k]``."""
        out: list[np.ndarray | None] = [None] * num_rows
        for i, pcm in zip(rows, self.decode_fn(requests) if requests else []):
            out[i] = _as_pcm(pcm)
        return out


def _as_pcm(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32).reshape(-1)
