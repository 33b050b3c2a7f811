"""The CSM program: a segment's text as the last turn of a conversation, a frame of 32 codebooks
per step (backbone + depth decoder inside the step), Mimi decoded once per frame per stream
(voices, context, options and how a segment runs: docs/models/csm.md).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from engine.backend import BackendInfo, JobError, OptionError
from engine.llm.options import checked_options, number_option, seed_option
from engine.llm.program import Collect
from engine.llm.scheduler import RequestError
from engine.llm.slot_codec import SlotCodec
from engine.llm.sequence import SamplingParams
from models.csm.codec import encode_frames
from models.csm.config import CsmConfig
from models.csm.head import CsmSlots
from models.csm.model import STOP, CsmModel
from models.csm.prompt import Tokenizer, Turn, build_prompt
from models.csm.voices import ContextVoice, PoolFull, VoiceCache, read_wav, resample

__all__ = ["CsmProgram", "CsmState", "DEFAULT_OPTIONS", "MAX_CONTEXT_CHARS", "MAX_CONTEXT_TURNS", "MAX_TURN_CHARS",
           "MAX_VOICE_S", "SPEAKERS", "parse_context"]

SPEAKERS = tuple(str(i) for i in range(10))
MAX_CONTEXT_TURNS = 8
MAX_CONTEXT_CHARS = 512  # the context option's string
MAX_TURN_CHARS = 1000  # a registered voice's transcript
MAX_VOICE_S = 30.0  # a registered voice's recording, at most
DEFAULT_OPTIONS: dict[str, Any] = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "max_tokens": 375, "seed": None,
                                   "context": None}
OPTION_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "top_k": (0, 2051), "max_tokens": (1, 4096)}


def parse_context(value: str) -> list[tuple[str, int]]:
    """A context option's string -> [(voice, speaker)]; ``ValueError`` naming what is wrong."""
    if len(value) > MAX_CONTEXT_CHARS:
        raise ValueError(f"context must be at most {MAX_CONTEXT_CHARS} characters")
    entries = [e.strip() for e in value.split(",")] if value.strip() else []
    if len(entries) > MAX_CONTEXT_TURNS:
        raise ValueError(f"context takes at most {MAX_CONTEXT_TURNS} turns, got {len(entries)}")
    out = []
    for i, entry in enumerate(entries):
        voice, sep, speaker = entry.partition(":")
        voice = voice.strip()
        if not voice:
            raise ValueError(f"context turn {i + 1} names no voice (entries are voice[:speaker], comma-separated)")
        if sep and speaker.strip() not in SPEAKERS:
            raise ValueError(f"context turn {i + 1}: the speaker must be an integer in [0, {len(SPEAKERS) - 1}], "
                             f"got {speaker.strip()!r}")
        out.append((voice, int(speaker) if sep else 0))
    return out


@dataclass(eq=False)  # identity: voices hold their users in weak sets
class CsmState:
    """One segment: its voice and context (as given), its slot and codec progress."""

    voice: str
    context: str | None
    slot: int = -1
    num_frames: int = 0  # frames through the codec


class CsmProgram:
    """CSM over the runtime; see the module docstring."""

    def __init__(self, model: CsmModel, config: CsmConfig, tokenizer: Tokenizer, *, slots: CsmSlots,
                 voices: VoiceCache, mimi: Any, codec_stream: Any, max_model_len: int, model_name: str = "csm",
                 seed_rng: random.Random | None = None) -> None:
        self.model, self.config, self.tokenizer = model, config, tokenizer
        self.slots, self.voices, self.mimi = slots, voices, mimi
        self.codec = SlotCodec(codec_stream, num_codes=config.num_codebooks, device=slots.last_codes.device)
        self.max_model_len = max_model_len
        self._seed_rng = seed_rng or random.Random()
        self._refs: dict[str, Any] = {}  # voice name -> its VoiceRef (encoded again if evicted)
        self._pending: CsmState | None = None  # made by new_state, completed by build_prompt
        self.stop_ids = frozenset({STOP})
        self.vocab_ids = None
        self.allowed_table = None
        self._totals = {"codec_frames": 0, "voices_encoded": 0}
        ranges: dict[str, Any] = {n: {"min": lo, "max": hi, "default": DEFAULT_OPTIONS[n]}
                                  for n, (lo, hi) in OPTION_RANGES.items()}
        ranges["seed"] = {"min": 0, "max": 2**63 - 1, "default": None}
        ranges["context"] = {"type": "string", "format": "voice[:speaker],... (registered voices, speakers 0-9)",
                             "max_turns": MAX_CONTEXT_TURNS, "max_chars": MAX_CONTEXT_CHARS, "default": None}
        # One decode row per Mimi frame: 12.5 a second of audio (admission, engine.admission).
        self.info = BackendInfo(model=model_name, voices=SPEAKERS, default_voice=SPEAKERS[0],
                                sample_rate=config.sample_rate, options=ranges, supports_cloning=True,
                                tokens_per_audio_second=config.sample_rate / config.frame_size)

    # -- voices -----------------------------------------------------------------------------

    def prepare_voice(self, voice_ref: Any) -> str:
        """A registered voice (``engine.messages.VoiceRef``: a WAV file, its rate, sha256 and
        transcript) as a context turn: encoded once (again if its sha256 changes or it was
        evicted); returns the name to pass to ``validate``. CSM needs the words spoken in the
        recording: a voice without a transcript is refused."""
        name = voice_ref.voice_id
        if name in SPEAKERS:
            raise OptionError("voice_unavailable", f"a registered voice cannot be named like a speaker id ({name!r})")
        if not (voice_ref.transcript or "").strip():
            raise OptionError("voice_unavailable", f"voice {name!r} has no transcript: CSM speaks in a voice by "
                              "continuing a conversation in which it was heard, and needs the words spoken in "
                              "its recording (register it with its transcript)")
        if len(voice_ref.transcript) > MAX_TURN_CHARS:
            raise OptionError("voice_unavailable", f"voice {name!r}: its transcript is longer than {MAX_TURN_CHARS} "
                              "characters")
        self._voice(name, voice_ref)
        self._refs[name] = voice_ref
        return name

    def _voice(self, name: str, ref: Any = None) -> ContextVoice:
        """The cached voice ``name``, encoded now if it is not (``OptionError`` if unusable)."""
        ref = ref or self._refs.get(name)
        if ref is None:
            raise OptionError("unknown_voice", f"unknown voice {name!r}; voices: speaker ids "
                              f"{', '.join(SPEAKERS)}, or a registered voice")
        cached = self.voices.fresh(name, ref.sha256)
        if cached is not None:
            return cached
        try:
            wav, rate = read_wav(ref.path)
        except ValueError as e:
            raise OptionError("voice_unavailable", f"voice {name!r}: {e}") from None
        if rate != ref.sample_rate:
            raise OptionError("voice_unavailable", f"voice {name!r}: the file is at {rate} Hz, its record says "
                              f"{ref.sample_rate}")
        seconds = wav.size / max(rate, 1)
        if not 0 < seconds <= MAX_VOICE_S:
            raise OptionError("voice_unavailable", f"voice {name!r} is {seconds:.1f} s long; CSM takes recordings "
                              f"of up to {MAX_VOICE_S:.0f} s")
        wav = resample(wav, rate, self.config.sample_rate)
        p = next(self.mimi.parameters())
        x = torch.from_numpy(wav).to(p.device, p.dtype)[None, None]
        with torch.inference_mode():
            codes = encode_frames(self.mimi, x, self.config.num_codebooks)[0].T  # [N, K]
        try:
            voice = self.voices.add(name, ref.sha256, ref.transcript.strip(), codes)
        except PoolFull as e:
            raise OptionError("capacity", f"voice {name!r}: {e}; retry when streams using other voices end") from None
        self._totals["voices_encoded"] += 1
        return voice

    # -- jobs -------------------------------------------------------------------------------

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if voice is None or voice == "":
            voice = SPEAKERS[0]
        if voice not in SPEAKERS and voice not in self._refs:
            raise OptionError("unknown_voice", f"unknown voice {voice!r}; voices: speaker ids {', '.join(SPEAKERS)}, "
                              "or a registered voice")
        out = checked_options(options, DEFAULT_OPTIONS, self._option)
        return voice, out

    def _option(self, name: str, value: Any) -> Any:
        if name == "seed":
            return seed_option(value)
        if name == "context":
            return self._context(value)
        return number_option(name, value, *OPTION_RANGES[name], integer=name in ("top_k", "max_tokens"))

    def _context(self, value: Any) -> str | None:
        """The context option, checked and normalised (``"v-a:0,v-b:1"``; None: no context)."""
        if value is None:
            return None
        if not isinstance(value, str):
            raise OptionError("invalid_option", "context must be a string of voice[:speaker] entries, "
                              f"comma-separated, got {type(value).__name__}")
        try:
            turns = parse_context(value)
        except ValueError as e:
            raise OptionError("invalid_option", str(e)) from None
        for voice, _ in turns:
            if voice not in self._refs:
                raise OptionError("unknown_voice", f"context voice {voice!r} is not a registered voice this server "
                                  "has prepared")
        return ",".join(f"{v}:{s}" for v, s in turns) or None

    def sampling_params(self, options: dict[str, Any]) -> SamplingParams:
        seed = options.get("seed")
        return SamplingParams(temperature=float(options["temperature"]), top_p=float(options["top_p"]),
                              top_k=int(options["top_k"]), repetition_penalty=1.0, max_tokens=int(options["max_tokens"]),
                              seed=self._seed_rng.getrandbits(63) if seed is None else int(seed))

    def new_state(self, voice: str, options: dict[str, Any]) -> CsmState:
        state = CsmState(voice=voice, context=options.get("context"))
        self._pending = state  # the runtime's next build_prompt call is this job's (LMBackend.add_job)
        return state

    def turns(self, text: str, voice: str, context: str | None, holder: Any = None) -> list[Turn]:
        """The conversation for a segment: the voice's turn, the context turns, the segment.
        The voices are held by ``holder`` (a sequence's state) until it is released."""
        speakers = [] if voice in SPEAKERS else [(voice, 0)]
        turns: list[Turn] = []
        for name, speaker in speakers + parse_context(context or ""):
            try:
                v = self._voice(name)
            except OptionError as e:
                raise RequestError(JobError(e.code, str(e), retryable=e.code == "capacity")) from None
            if holder is not None:
                self.voices.hold(v, holder)
            turns.append(Turn(speaker, v.transcript, v.rows))
        turns.append(Turn(int(voice) if voice in SPEAKERS else 0, text.strip()))
        return turns

    def build_prompt(self, text: str, voice: str, options: dict[str, Any]) -> list[int]:
        """The segment's packed prompt ids; ``too_long`` when the conversation leaves no room.
        The state made by the ``new_state`` call just before (``LMBackend.add_job`` makes both,
        for one job at a time) holds the voices; a call with none pending (the warm-up's length
        probes) only returns ids."""
        state, self._pending = self._pending, None
        turns = self.turns(text, voice, options.get("context"), holder=state)
        ids = build_prompt(self.tokenizer, self.config, turns)
        if len(ids) + 1 > self.max_model_len:
            frames = sum(len(t.rows) for t in turns if t.rows)
            raise RequestError(JobError(
                "too_long", f"this segment's conversation takes {len(ids)} positions ({frames} of them context audio "
                f"frames) and a row holds {self.max_model_len} (max_model_len); use fewer or shorter context turns "
                "or shorter text", retryable=False))
        return ids

    def bind_slot(self, state: CsmState, slot: int) -> None:
        state.slot = slot
        state.num_frames = 0

    def allowed_row(self, state: CsmState, ahead: int = 0) -> int:
        return 0

    def note_step_interval(self, seconds: float) -> None:
        pass

    def note_due(self, state: CsmState, due_in_s: float) -> None:
        pass

    def release(self, state: CsmState) -> None:
        self.voices.release(state)

    def totals(self) -> dict[str, int]:
        return dict(self._totals)

    # -- frames -> audio --------------------------------------------------------------------

    def launch_postprocess(self, states: list[CsmState], tokens: list[Any]) -> Collect:
        """Every row's frame through the streaming codec, one batched call (``SlotCodec``)."""
        if not states:
            return lambda: []
        fresh = [s.slot for s in states if s.num_frames == 0]
        for s in states:
            s.num_frames += 1
        self._totals["codec_frames"] += len(states)
        top = self.config.mimi.quantizer.bins - 1  # (codebook specials, never sampled by a trained model)
        codes = [[min(int(c), top) for c in row[1:]] for row in tokens]
        return self.codec.launch([s.slot for s in states], codes, fresh, clip=True)

    def launch_finish(self, states: list[CsmState]) -> Collect:
        """Mimi is causal: a finished segment has no audio left. Its voices are released."""
        for st in states:
            self.release(st)
        return lambda: [None] * len(states)
