"""The Qwen3-TTS program: text streamed into the talker's dual track, 16 codebooks a frame, the
12 Hz codec decoded once per frame per stream.

How the runtime drives it (a turn as one sequence, ``next_input``, ``Qwen3Head``,
``Qwen3Slots``): docs/adding_a_model.md, "The worked example: Qwen3-TTS".
"""

from __future__ import annotations

from collections import OrderedDict
import random
import unicodedata
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from engine.backend import BackendInfo, OptionError
from engine.llm.options import checked_options, number_option, seed_option
from engine.llm.program import Collect
from engine.llm.sampler import Sampler, gumbel_noise_salts
from engine.llm.sequence import SamplingParams
from engine.llm.slot_codec import SlotCodec
from engine.llm.token_head import RowInputs
from models.qwen3_tts.code_predictor import MIN_FRAMES_BEFORE_EOS, code0_mask, decode_frame
from models.qwen3_tts.config import Qwen3TTSConfig
from models.qwen3_tts.prompt import TextStream, TextTokenizer, build_prompt, languages, speakers
from models.qwen3_tts.talker import XVECTOR, Talker, pack, unpack

__all__ = ["LAST_FRAME", "Qwen3Forward", "Qwen3Head", "Qwen3Program", "Qwen3Slots", "Qwen3State",
           "SAMPLES_PER_FRAME", "StandInTokenizer"]

LAST_FRAME = XVECTOR - 1  # 4093: a decode row's codec track is its slot's previous frame
SAMPLES_PER_FRAME = 1920  # 80 ms at 24 kHz
FRAMES_PER_SECOND = 12.5
MAX_VOICES = 256  # registered voices whose x-vectors an engine keeps
# The reference's generation defaults (talker and code predictor alike).
DEFAULT_OPTIONS: dict[str, Any] = {"temperature": 0.9, "top_p": 1.0, "top_k": 50, "repetition_penalty": 1.05,
                                   "max_tokens": 1500, "language": "auto", "instruct": None, "seed": None}
OPTION_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "top_k": (0, 2048), "repetition_penalty": (0.5, 2.0),
                 "max_tokens": (1, 8192)}
# Scripts the model's ten languages are written in (unicodedata names start with these words).
_SCRIPTS = ("LATIN", "CJK", "HIRAGANA", "KATAKANA", "HANGUL", "CYRILLIC", "IDEOGRAPHIC", "FULLWIDTH", "HALFWIDTH",
            "DIGIT", "SPACE", "BOPOMOFO")


class Qwen3Slots:
    """Per-slot device state shared by the forward and the head (row ``max_num_seqs``: padding)."""

    def __init__(self, talker: Talker, max_num_seqs: int, device: torch.device | str) -> None:
        cfg = talker.config
        s = max_num_seqs + 1
        dtype = talker.codec_head.weight.dtype
        self.last_codes = torch.zeros(s, cfg.num_code_groups, dtype=torch.int64, device=device)  # [S, 16]
        self.xvectors = torch.zeros(s, cfg.hidden_size, dtype=dtype, device=device)  # [S, H]
        self.seen = torch.zeros(s, cfg.vocab_size, dtype=torch.bool, device=device)  # code-0 ids generated


class Qwen3Forward:
    """``forward(ids [T], positions [T], attn, token_rows [T]) -> hidden [T, H]``: packed ids
    (``talker.pack``) whose codec field is a codec id, ``NO_CODEC``, ``XVECTOR`` (the row's
    x-vector) or ``LAST_FRAME`` (the row's previous frame, 16 codes summed)."""

    def __init__(self, talker: Talker, slots: Qwen3Slots) -> None:
        self.talker = talker
        self.slots = slots

    def __call__(self, ids: Tensor, positions: Tensor, attn: Any, token_rows: Tensor) -> Tensor:
        t = self.talker
        text_ids, codec = unpack(ids)
        x = t.embed_text(text_ids)  # [T, H]
        is_codec = codec < LAST_FRAME
        cemb = t.model.codec_embedding(torch.where(is_codec, codec, torch.zeros_like(codec)))  # [T, H]
        track = torch.where(is_codec[:, None], cemb, torch.zeros_like(cemb))
        xv = self.slots.xvectors.index_select(0, token_rows)  # [T, H]
        track = torch.where((codec == XVECTOR)[:, None], xv.to(track.dtype), track)
        frame = t.embed_codes(self.slots.last_codes.index_select(0, token_rows))  # [T, H]
        track = torch.where((codec == LAST_FRAME)[:, None], frame.to(track.dtype), track)
        return t(x + track, positions, attn)  # [T, H]


class Qwen3Head:
    """``TokenHead``: one frame of 16 codes per row (``decode_frame``), written to the slots' state."""

    def __init__(self, talker: Talker, slots: Qwen3Slots) -> None:
        self.talker = talker
        self.slots = slots
        self.num_columns = talker.config.num_code_groups
        self.allowed = code0_mask(talker.config, talker.codec_head.weight.device)  # [V]
        self.sampler = Sampler()

    def reset(self, rows: Tensor) -> None:
        self.slots.seen.index_fill_(0, rows, False)

    def sample(self, hidden: Tensor, r: RowInputs) -> tuple[Tensor, Tensor]:
        seen = self.slots.seen.index_select(0, r.rows)  # [B, V]
        no_penalty = torch.ones_like(r.repetition_penalty)
        cp = self.talker.config.code_predictor
        # The code predictor's codebooks (salts 1..G-1, one vocabulary) draw their noise at once;
        # codebook 0 (the talker's vocabulary) draws its own in the sampler.
        noise = None if r.all_greedy else gumbel_noise_salts(r.seeds, r.steps, cp.vocab_size,
                                                            range(1, cp.num_code_groups))

        settings = self.sampler.rows(r.temperature, r.top_p, r.top_k)  # once for every codebook

        def sample(logits: Tensor, salt: int) -> Tensor:  # codebook ``salt`` (0: the talker's head)
            return self.sampler(
                logits, settings=settings, seeds=r.seeds, steps=r.steps,
                repetition_penalty=r.repetition_penalty if salt == 0 else no_penalty,
                seen=seen if salt == 0 else None, all_greedy=r.all_greedy, any_top_p=r.any_top_p, salt=salt,
                noise=None if salt == 0 or noise is None else noise[salt - 1])

        codes = decode_frame(self.talker, hidden, sample, allowed=self.allowed,
                             eos_ok=r.steps >= MIN_FRAMES_BEFORE_EOS, slots=r.rows,
                             last_codes=self.slots.last_codes)  # [B, 16]
        code0 = codes[:, 0]
        self.slots.seen[r.rows, code0] = self.slots.seen[r.rows, code0] | r.keep
        return codes, codes


class StandInTokenizer:
    """``--load-format dummy`` without tokenizer files: the Qwen2 pre-tokenizer's pieces, each one
    id (a hash), the template's special tokens at their ids. About Qwen's token counts for
    English (a word, its space and its punctuation), deterministic, no files."""

    def __init__(self, config: Qwen3TTSConfig) -> None:
        from tokenizers import Regex, pre_tokenizers

        from models.qwen3_tts.prompt import QWEN2_SPLIT_PATTERN

        self._split = pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False)
        self._special = {"<|im_start|>": config.im_start_token_id, "<|im_end|>": config.im_end_token_id}
        self._span = max(1, min(100_000, config.tts_pad_token_id - 2000))

    def encode(self, text: str, add_special_tokens: bool = False) -> Any:
        ids: list[int] = []
        words: list[int | None] = []
        word = 0
        for part in _split_special(text, self._special):
            if part in self._special:
                ids.append(self._special[part])
                words.append(None)
                continue
            for piece, _ in self._split.pre_tokenize_str(part):
                ids.append(1000 + zlib.crc32(piece.encode()) % self._span)
                words.append(word)
                word += 1
        return _Encoding(ids, words)


@dataclass
class _Encoding:
    ids: list[int]
    word_ids: list[int | None]


def _split_special(text: str, special: dict[str, int]) -> list[str]:
    out, i = [], 0
    while i < len(text):
        j = min((text.find(s, i) for s in special if text.find(s, i) >= 0), default=-1)
        if j < 0:
            out.append(text[i:])
            break
        if j > i:
            out.append(text[i:j])
        tok = next(s for s in special if text.startswith(s, j))
        out.append(tok)
        i = j + len(tok)
    return [p for p in out if p]


@dataclass
class Qwen3State:
    """One turn: its voice, options, text so far (as final token ids) and codec progress."""

    speaker: str | None
    language: str
    instruct_ids: list[int] | None
    stream: TextStream
    xvector: Tensor | None = None
    text_ids: list[int] = field(default_factory=list)  # final text token ids received
    is_final: bool = False
    prefix: list[int] | None = None  # the prompt (built once the first text id is final)
    slot: int = -1
    num_frames: int = 0  # frames through the codec


class Qwen3Program:
    """Qwen3-TTS 12 Hz over the runtime; see the module docstring."""

    input_streaming = True
    reserve_tokens = 256  # KV tokens at admission (about 20 s of audio); pages are added as it grows

    def __init__(self, talker: Talker, config: Qwen3TTSConfig, tokenizer: Any, codec_stream: Any, *,
                 model_name: str = "qwen3-tts", slots: Qwen3Slots, speaker_encoder: Any = None,
                 seed_rng: random.Random | None = None) -> None:
        self.talker = talker
        self.config = config
        self.tokenizer = tokenizer if isinstance(tokenizer, TextTokenizer) else TextTokenizer(tokenizer)
        self.codec = SlotCodec(codec_stream, num_codes=config.talker.num_code_groups, device=slots.last_codes.device)
        self.slots = slots
        self.speaker_encoder = speaker_encoder
        self._seed_rng = seed_rng or random.Random()
        self.stop_ids = frozenset({config.talker.codec_eos_token_id})
        self.vocab_ids = None
        self.allowed_table = None
        self._cuda_stream = None
        dev = slots.last_codes.device
        if dev.type == "cuda":
            self._cuda_stream = torch.cuda.Stream(dev)
        self._totals = {"codec_frames": 0}
        # Registered voices prepared for this engine: id -> (sha256, x-vector [H]); an LRU.
        self._voices: OrderedDict[str, tuple[str, Tensor]] = OrderedDict()
        voices = tuple(speakers(config))
        ranges: dict[str, Any] = {n: {"min": lo, "max": hi, "default": DEFAULT_OPTIONS[n]}
                                  for n, (lo, hi) in OPTION_RANGES.items()}
        ranges["seed"] = {"min": 0, "max": 2**63 - 1, "default": None}
        ranges["language"] = {"choices": languages(config), "default": "auto"}
        if config.supports_instruct:
            ranges["instruct"] = {"type": "string", "default": None}
        self.info = BackendInfo(model=model_name, voices=voices, default_voice=voices[0] if voices else "",
                                supports_cloning=config.can_clone and speaker_encoder is not None,
                                sample_rate=24000, options=ranges, input_streaming=True,
                                # a decode row samples a whole frame of 1,920 samples: 12.5 a second
                                tokens_per_audio_second=24000 / SAMPLES_PER_FRAME)

    # -- jobs -------------------------------------------------------------------------------

    def prepare_voice(self, voice_ref: Any) -> str:
        """A registered voice (``engine.messages.VoiceRef``): its x-vector from the checkpoint's
        speaker encoder, computed once per file (by sha256) and kept for the ``MAX_VOICES`` most
        recently used; returns the name ``validate`` then takes."""
        if self.speaker_encoder is None:
            raise OptionError("cloning_unsupported", "this checkpoint cannot clone a voice (no speaker encoder: use a "
                              "Base checkpoint, e.g. --model qwen3-tts-1.7b-base)")
        name = voice_ref.voice_id
        known = self._voices.get(name)
        if known is not None and known[0] == voice_ref.sha256:
            self._voices.move_to_end(name)
            return name
        from engine.voice_audio import read_voice

        wav = read_voice(voice_ref, self.speaker_encoder.config.sample_rate)
        with torch.inference_mode():
            xvector = self.speaker_encoder.embed(torch.from_numpy(wav)).detach()  # [H]
        self._voices[name] = (voice_ref.sha256, xvector)
        while len(self._voices) > MAX_VOICES:
            self._voices.popitem(last=False)
        return name

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if voice is not None and voice in self._voices:  # a registered voice, prepared
            return voice, checked_options(options, DEFAULT_OPTIONS, self._option)
        served = self.info.voices
        if voice is None or voice == "":
            voice = self.info.default_voice  # (a Base checkpoint has none: no speaker row, as the reference allows)
        if voice and voice.lower() not in served:
            raise OptionError("unknown_voice", f"unknown voice {voice!r}; voices: {', '.join(served) or 'none'}")
        out = checked_options(options, DEFAULT_OPTIONS, self._option)
        return voice.lower(), out

    def _option(self, name: str, value: Any) -> Any:
        if name == "seed":
            return seed_option(value)
        if name == "language":
            if not isinstance(value, str) or value.lower() not in languages(self.config):
                raise OptionError("invalid_option", f"unknown language {value!r}; languages: "
                                  f"{', '.join(languages(self.config))}")
            return value.lower()
        if name == "instruct":
            if value is None:
                return None
            if not self.config.supports_instruct:
                raise OptionError("invalid_option", "this checkpoint does not take an instruct")
            if not isinstance(value, str) or len(value) > 1000:
                raise OptionError("invalid_option", "instruct must be a string of at most 1000 characters")
            return value
        return number_option(name, value, *OPTION_RANGES[name], integer=name in ("top_k", "max_tokens"))

    def sampling_params(self, options: dict[str, Any]) -> SamplingParams:
        seed = options.get("seed")
        return SamplingParams(
            temperature=float(options["temperature"]), top_p=float(options["top_p"]), top_k=int(options["top_k"]),
            repetition_penalty=float(options["repetition_penalty"]), max_tokens=int(options["max_tokens"]),
            seed=self._seed_rng.getrandbits(63) if seed is None else int(seed),
        )

    def new_state(self, voice: str, options: dict[str, Any]) -> Qwen3State:
        instruct = options.get("instruct")
        cloned = self._voices.get(voice)
        return Qwen3State(
            speaker=None if cloned is not None else (voice or None), language=options.get("language", "auto"),
            xvector=None if cloned is None else cloned[1],
            instruct_ids=self.tokenizer.instruct_ids(instruct) if instruct else None,
            stream=TextStream(self.tokenizer),
        )

    # -- text -------------------------------------------------------------------------------

    def push_text(self, state: Qwen3State, text: str, *, flush: bool, final: bool) -> None:
        if state.is_final:
            return
        _check_script(text)
        ids = state.stream.push(text) if text else []
        if final or flush:  # flush: release the last word too; later text starts a new piece
            ids = ids + state.stream.end()
            if not final:
                state.stream = TextStream(self.tokenizer)
        state.text_ids.extend(ids)
        state.is_final = final

    def prompt_ids(self, state: Qwen3State) -> list[int] | None:
        if state.prefix is None and state.text_ids:
            prompt = build_prompt(self.config, state.text_ids[:1], role_ids=self.tokenizer.role_ids,
                                  language=state.language, speaker=state.speaker, xvector=state.xvector is not None,
                                  instruct_ids=state.instruct_ids)
            state.prefix = prompt.packed
        return state.prefix

    def next_input(self, state: Qwen3State, position: int) -> int | None:
        k = position  # the row that generates frame ``position`` feeds back frame position - 1 ...
        track = len(state.text_ids) - 1  # ... with text-track entry position - 1 (the prompt holds text 0)
        if k - 1 < track:
            return pack(state.text_ids[k], LAST_FRAME)
        if not state.is_final:
            return None  # the text has run out on a turn that goes on: pause
        text = self.config.tts_eos_token_id if k - 1 == track else self.config.tts_pad_token_id
        return pack(text, LAST_FRAME)

    def bind_slot(self, state: Qwen3State, slot: int) -> None:
        state.slot = slot
        state.num_frames = 0
        if state.xvector is not None:
            self.slots.xvectors[slot].copy_(state.xvector.to(self.slots.xvectors.dtype), non_blocking=True)

    def allowed_row(self, state: Qwen3State, ahead: int = 0) -> int:
        return 0

    def note_step_interval(self, seconds: float) -> None:
        pass

    def note_due(self, state: Qwen3State, due_in_s: float) -> None:
        pass

    def release(self, state: Qwen3State) -> None:
        pass

    def totals(self) -> dict[str, int]:
        return dict(self._totals)

    # -- frames -> audio --------------------------------------------------------------------

    def launch_postprocess(self, states: list[Qwen3State], tokens: list[Any]) -> Collect:
        """Every row's frame through the streaming codec, one batched call."""
        fresh = [s.slot for s in states if s.num_frames == 0]
        for s in states:
            s.num_frames += 1
        self._totals["codec_frames"] += len(states)
        return self.codec.launch([s.slot for s in states], tokens, fresh)

    def launch_finish(self, states: list[Qwen3State]) -> Collect:
        """The codec is causal: a finished turn has no audio left."""
        return lambda: [None] * len(states)


def _check_script(text: str) -> None:
    """Refuse letters of scripts none of the model's languages is written in (that stream only).
    Compatibility forms are judged as their plain letters (NFKC): 'ª' is an 'a', not a script."""
    for ch in unicodedata.normalize("NFKC", text):
        if ch.isascii() or not ch.isalpha():
            continue
        name = unicodedata.name(ch, "")
        if not name.startswith(_SCRIPTS):
            script = name.split(" ")[0] if name else f"U+{ord(ch):04X}"
            raise ValueError(f"Qwen3-TTS cannot speak text in the {script.title()} script ({ch!r}); it speaks "
                             "Chinese, English, Japanese, Korean, German, French, Russian, Portuguese, Spanish "
                             "and Italian")

