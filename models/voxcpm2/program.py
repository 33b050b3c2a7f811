"""The VoxCPM2 program: a segment's whole text in the prompt, one patch of latents per step from
the flow-matching head, the streaming AudioVAE in chunks of patches, 48 kHz out (options and how
a sequence runs: docs/models/voxcpm2.md).
"""

from __future__ import annotations

import math
import random
import re
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.backend import BackendInfo, JobError, OptionError
from engine.llm.program import Collect
from engine.llm.scheduler import RequestError
from engine.llm.sequence import SamplingParams
from models.voxcpm2.audio import ChunkDecoder, ChunkRow
from models.voxcpm2.head import PatchHead
from models.voxcpm2.model import STOP, SlotFeatures
from models.voxcpm2.prompt import Prompt, build_prompt, max_patches, normalize_text
from models.voxcpm2.voices import ClonedVoice, encode_voice

__all__ = ["DEFAULT_VOICE", "MAX_PATCHES", "StandInTokenizer", "VoxCPM2Program", "VoxCPM2State"]

DEFAULT_VOICE = "default"  # zero-shot: no reference audio
MAX_PATCHES = 4096  # the reference's max_len default and the cap of max_tokens
# name: (kind, low, high); the defaults are the reference's
OPTION_RANGES: dict[str, tuple[type, float, float]] = {
    "inference_timesteps": (int, 1, 10), "cfg_value": (float, 0.0, 10.0), "min_len": (int, 0, MAX_PATCHES),
    "max_tokens": (int, 1, MAX_PATCHES), "temperature": (float, 0.0, 2.0),
}
DEFAULT_OPTIONS: dict[str, Any] = {"inference_timesteps": 10, "cfg_value": 2.0, "min_len": 2,
                                   "max_tokens": MAX_PATCHES, "temperature": 1.0, "seed": None}


class StandInTokenizer:
    """``--load-format dummy`` without tokenizer files: a word, a punctuation mark or a CJK
    character is one id (a hash above the audio specials), deterministic, no files."""

    _PIECES = re.compile(r"[\u4e00-\u9fff]|\w+|[^\w\s]")

    def __init__(self, vocab_size: int) -> None:
        self._low, self._span = 105, vocab_size - 105

    def ids(self, text: str) -> list[int]:
        return [self._low + zlib.crc32(p.encode()) % self._span for p in self._PIECES.findall(text)]


@dataclass
class VoxCPM2State:
    """One segment: its voice and settings, its prompt, and its audio progress."""

    voice: ClonedVoice | None
    steps: int
    cfg: float
    min_len: int
    max_tokens: int
    prompt: Prompt | None = None  # set by build_prompt
    cap: int = 0  # the most patches this segment takes (min(6 * text tokens + 10, max_tokens))
    slot: int = -1
    num_patches: int = 0  # patches through launch_postprocess
    chunks: ChunkRow | None = None  # the decoder's progress (set in bind_slot)
    is_done: bool = False  # launch_finish or release has been called


class VoxCPM2Program:
    """VoxCPM2 over the runtime; see the module docstring."""

    def __init__(self, model: Any, vae: Any, config: Any, tokenizer: Any, *, head: PatchHead, feats: SlotFeatures,
                 decoder: ChunkDecoder, max_model_len: int, model_name: str = "voxcpm2",
                 seed_rng: random.Random | None = None, max_cached_voices: int = 256) -> None:
        self.model, self.vae, self.config = model, vae, config
        self.tokenizer = tokenizer
        self.head, self.feats, self.decoder = head, feats, decoder
        self.max_model_len = max_model_len
        self._seed_rng = seed_rng or random.Random()
        self.stop_ids = frozenset({STOP})
        self.vocab_ids = None
        self.allowed_table = None
        self.voices: OrderedDict[str, ClonedVoice] = OrderedDict()  # registered (cloned) voices, newest last
        self.max_cached_voices = max_cached_voices
        self._voice_keys: dict[str, str] = {}  # voice name -> the sha256 it was encoded from
        self._pending: VoxCPM2State | None = None  # made by new_state, completed by build_prompt
        self._owners: dict[int, VoxCPM2State] = {}  # slot -> the last sequence bound to it
        self.ranges = dict(OPTION_RANGES, inference_timesteps=(int, 1, head.max_steps))
        self.defaults = dict(DEFAULT_OPTIONS, inference_timesteps=min(10, head.max_steps))
        options: dict[str, Any] = {n: {"min": lo, "max": hi, "default": self.defaults[n]}
                                   for n, (_, lo, hi) in self.ranges.items()}
        options["seed"] = {"min": 0, "max": 2**63 - 1, "default": None}
        self.info = BackendInfo(model=model_name, voices=(DEFAULT_VOICE,), default_voice=DEFAULT_VOICE,
                                sample_rate=config.sample_rate, options=options, supports_cloning=True,
                                # a decode row makes a patch of 7,680 samples: 6.25 a second
                                tokens_per_audio_second=config.sample_rate / config.patch_samples)

    # -- voices -----------------------------------------------------------------------------

    def add_voice(self, name: str, *, sample_rate: int, ref_wav: Any = None, prompt_wav: Any = None,
                  prompt_text: str | None = None) -> ClonedVoice:
        """Encode and register a cloned voice (mono audio at ``sample_rate``: reference audio,
        and/or continuation audio with its transcript); raises ``OptionError`` if unusable."""
        if not name or name == DEFAULT_VOICE:
            raise OptionError("invalid_voice", f"a cloned voice needs a name other than {DEFAULT_VOICE!r}")
        try:
            voice = encode_voice(self.vae, self.config.patch_size, name, device=self.feats.prompt.device,
                                 sample_rate=sample_rate, ref_wav=ref_wav, prompt_wav=prompt_wav,
                                 prompt_text=None if prompt_text is None else normalize_text(prompt_text))
        except ValueError as e:
            raise OptionError("voice_unavailable", f"voice {name!r}: {e}") from None
        room = self.feats.max_prompt_patches
        if voice.num_patches > room:
            seconds = room * self.config.patch_samples / self.config.sample_rate
            raise OptionError("voice_unavailable", f"voice {name!r} is {voice.num_patches} patches of audio; a "
                              f"slot holds {room} ({seconds:.1f} s in all)")
        self.voices[name] = voice
        self.voices.move_to_end(name)
        while len(self.voices) > self.max_cached_voices:  # (running sequences keep their own reference)
            old, _ = self.voices.popitem(last=False)
            self._voice_keys.pop(old, None)
        return voice

    def prepare_voice(self, voice_ref: Any) -> str:
        """A registered voice of the voice store (``engine.messages.VoiceRef``: a WAV file, its
        rate, sha256 and transcript), read and checked against its record
        (``engine.voice_audio.read_voice``: ``voice_unavailable`` otherwise), encoded once (again
        only if its sha256 changes); returns the name ``validate`` then takes. A transcript makes
        it a reference + continuation voice, none a reference voice."""
        name = voice_ref.voice_id
        if name in self.voices and self._voice_keys.get(name) == voice_ref.sha256:
            self.voices.move_to_end(name)
            return name
        from engine.voice_audio import read_voice

        rate = self.vae.config.sample_rate
        wav = read_voice(voice_ref, rate)
        text = voice_ref.transcript or None
        self.add_voice(name, sample_rate=rate, ref_wav=wav, prompt_wav=wav if text else None, prompt_text=text)
        self._voice_keys[name] = voice_ref.sha256
        return name

    # -- jobs -------------------------------------------------------------------------------

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if voice is None or voice == "":
            voice = DEFAULT_VOICE
        if voice != DEFAULT_VOICE and voice not in self.voices:
            raise OptionError("unknown_voice", f"unknown voice {voice!r}; voices: {DEFAULT_VOICE} (zero-shot) or a "
                              "registered (cloned) voice")
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise OptionError("invalid_option", f"unknown option {unknown[0]!r}; options: {', '.join(self.defaults)}")
        out = dict(self.defaults)
        for name, value in options.items():
            out[name] = self._option(name, value)
        return voice, out

    def _option(self, name: str, value: Any) -> Any:
        if name == "seed":
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
                raise OptionError("invalid_option", f"seed must be an integer in [0, 2^63), got {value!r}")
            return value
        kind, lo, hi = self.ranges[name]
        ok = isinstance(value, int) if kind is int else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or not math.isfinite(value) or not lo <= value <= hi:
            what = "an integer" if kind is int else "a number"
            raise OptionError("invalid_option", f"{name} must be {what} in [{lo}, {hi}], got {value!r}")
        return kind(value)

    def sampling_params(self, options: dict[str, Any]) -> SamplingParams:
        seed = options.get("seed")
        return SamplingParams(temperature=float(options["temperature"]), top_p=1.0, repetition_penalty=1.0,
                              seed=self._seed_rng.getrandbits(63) if seed is None else int(seed),
                              max_tokens=int(options["max_tokens"]))

    def new_state(self, voice: str, options: dict[str, Any]) -> VoxCPM2State:
        cloned = self.voices.get(voice)
        if cloned is None and voice != DEFAULT_VOICE:  # dropped from the cache since validate
            raise RequestError(JobError("voice_unavailable", f"voice {voice!r} is no longer loaded (more than "
                                        f"{self.max_cached_voices} voices were prepared since); open the stream "
                                        "again", retryable=True))
        state = VoxCPM2State(voice=cloned, steps=int(options["inference_timesteps"]),
                             cfg=float(options["cfg_value"]), min_len=int(options["min_len"]),
                             max_tokens=int(options["max_tokens"]))
        self._pending = state
        return state

    def build_prompt(self, text: str, voice: str, options: dict[str, Any]) -> list[int]:
        """The segment's prompt ids; completes (and checks the size of) the pending state."""
        state, self._pending = self._pending, None
        v = state.voice if state is not None else self.voices.get(voice)
        text = normalize_text(text)
        target = self.tokenizer.ids(text)
        words = self.tokenizer.ids(v.prompt_text + text) if v is not None and v.prompt is not None else target
        prompt = build_prompt(words, ref_patches=0 if v is None else v.num_ref,
                              prompt_patches=0 if v is None else v.num_prompt)
        if state is not None:
            cap = max_patches(target, state.max_tokens)
            need = len(prompt.ids) + cap
            if need > self.max_model_len:
                raise RequestError(JobError(
                    "too_long", f"this segment needs {need} positions ({len(prompt.ids)} of prompt and up to "
                    f"{cap} patches) and a row holds {self.max_model_len} (max_model_len); send shorter text, "
                    "a shorter voice or a lower max_tokens", retryable=False))
            state.prompt, state.cap = prompt, cap
        return prompt.ids

    def bind_slot(self, state: VoxCPM2State, slot: int) -> None:
        """Before the sequence's first step: the head's settings and the voice's patches for ``slot``."""
        self.decoder.wait_slot(slot)  # the last chunk gathered from this slot (and its copies) has been read
        old = self._owners.get(slot)
        if old is not None and not old.is_done:  # it ended at the step just taken; its stop comes later
            self.decoder.spill(old.chunks)
        self._owners[slot] = state
        state.slot = slot
        v = state.voice
        self.head.configure(slot, steps=state.steps, cfg=state.cfg, min_len=state.min_len, max_len=state.cap,
                            cond=None if v is None else v.cond)
        patches = None if v is None else v.patches()
        if patches is not None:
            self.feats.prompt[slot, : patches.shape[0]].copy_(patches.to(self.feats.prompt.dtype), non_blocking=True)
        context = None if v is None else v.context
        self.decoder.set_context(slot, context)
        state.chunks = ChunkRow(slot, 0 if context is None else int(context.shape[0]), 0, 0)
        state.num_patches = 0

    def allowed_row(self, state: VoxCPM2State, ahead: int = 0) -> int:
        return 0

    def note_step_interval(self, seconds: float) -> None:
        pass

    def note_due(self, state: VoxCPM2State, due_in_s: float) -> None:
        pass

    def release(self, state: VoxCPM2State) -> None:
        state.is_done = True  # (the slot's decoder state is reset by the next sequence's first chunk)

    def totals(self) -> dict[str, int]:
        out = {"vae_chunks": self.decoder.num_chunks}
        graphs = self.decoder.graphs
        if graphs is not None:
            out["vae_rows_replayed"] = int(graphs.rows_replayed)
        return out

    # -- patches -> audio -------------------------------------------------------------------

    def launch_postprocess(self, states: list[VoxCPM2State], tokens: list[Any]) -> Collect:
        """A patch per row (its index in column 1); every row with a whole chunk decodes it."""
        for st in states:
            st.num_patches += 1
            st.chunks.available = st.chunks.num_context + st.num_patches
        return self.decoder.run([st.chunks for st in states], final=False)

    def launch_finish(self, states: list[VoxCPM2State]) -> Collect:
        """These sequences stopped: their stop patch (not passed to ``launch_postprocess``) and
        every patch not yet decoded, the last chunk padded and cut."""
        for st in states:
            if st.num_patches < st.cap:  # (a sequence cut at max_tokens had its last patch counted)
                st.num_patches += 1
            st.is_done = True
            st.chunks.available = st.chunks.num_context + st.num_patches
        return self.decoder.run([st.chunks for st in states], final=True)

    def make_vae_graphs(self, buckets: list[int]) -> Any:
        return self.decoder.make_graphs(buckets)
