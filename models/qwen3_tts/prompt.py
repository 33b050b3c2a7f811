"""Text tokenization and prompt building for Qwen3-TTS, as the reference (qwen-tts 0.1.1) does it.

``build_prompt`` lays out the prompt position by position and ``TextStream`` turns text arriving
in pieces into exactly the ids the whole text gets (docs/models/qwen3_tts.md, "Prompt").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.qwen3_tts.config import Qwen3TTSConfig
from models.qwen3_tts.talker import NO_CODEC, XVECTOR, pack

__all__ = [
    "TextTokenizer", "TextStream", "Prompt", "build_prompt", "speakers", "languages", "resolve_speaker",
    "resolve_language", "QWEN2_SPLIT_PATTERN",
]

# The Qwen2 pre-tokenizer's split pattern (tokenizer.json of Qwen2/Qwen3 checkpoints).
QWEN2_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                       r"|\s*[\r\n]+|\s+(?!\S)|\s+")

_ASSISTANT = "<|im_start|>assistant\n{}<|im_end|>\n<|im_start|>assistant\n"
_ROLE = "<|im_start|>assistant\n"
_INSTRUCT = "<|im_start|>user\n{}<|im_end|>\n"


def _qwen2_tokenizer_from_vocab(d: Path) -> Any:
    """A ``tokenizers.Tokenizer`` from vocab.json + merges.txt + tokenizer_config.json (Qwen2 layout)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.BPE.from_file(str(d / "vocab.json"), str(d / "merges.txt")))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    cfg_file = d / "tokenizer_config.json"
    added = json.loads(cfg_file.read_text()).get("added_tokens_decoder", {}) if cfg_file.is_file() else {}
    for _, t in sorted(added.items(), key=lambda kv: int(kv[0])):
        tok.add_special_tokens([AddedToken(t["content"], special=True, normalized=False)])
    return tok


class TextTokenizer:
    """The checkpoint's text tokenizer (Hugging Face ``tokenizers``), with the reference's templates."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.role_ids = self.encode(_ROLE)
        if len(self.role_ids) != 3:
            raise ValueError(f"'<|im_start|>assistant\\n' must be 3 tokens, got {self.role_ids}")

    @classmethod
    def from_dir(cls, d: str | Path) -> TextTokenizer:
        """tokenizer.json when present, else vocab.json + merges.txt (+ tokenizer_config.json)."""
        from tokenizers import Tokenizer

        d = Path(d)
        if (d / "tokenizer.json").is_file():
            return cls(Tokenizer.from_file(str(d / "tokenizer.json")))
        if (d / "vocab.json").is_file() and (d / "merges.txt").is_file():
            return cls(_qwen2_tokenizer_from_vocab(d))
        raise FileNotFoundError(f"{str(d)!r} has no tokenizer.json nor vocab.json + merges.txt")

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def text_ids(self, text: str) -> list[int]:
        """The text's ids as the reference slices them out of its assistant template."""
        return self.encode(_ASSISTANT.format(text))[3:-5]

    def instruct_ids(self, instruct: str) -> list[int]:
        return self.encode(_INSTRUCT.format(instruct))


class TextStream:
    """Incremental tokenization: ``push(piece)`` returns the ids now final, ``end()`` the rest.

    The concatenation of everything returned equals ``tokenizer.text_ids(whole text)``. A token is
    final once a later pre-token exists: the pre-tokenizer's pieces before the last one do not
    change when text is appended (BPE never merges across them).
    """

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self.text = ""
        self.num_released = 0
        self.ended = False

    def push(self, piece: str) -> list[int]:
        if self.ended:
            raise ValueError("TextStream.push after end()")
        self.text += piece
        enc = self.tokenizer.tok.encode(_ROLE + self.text, add_special_tokens=False)
        ids, words = enc.ids[3:], enc.word_ids[3:]
        if not ids:
            return []
        last = words[-1]
        n_final = len(ids)
        while n_final > 0 and words[n_final - 1] == last:
            n_final -= 1
        return self._release(ids, n_final)

    def end(self) -> list[int]:
        """The remaining ids (the whole text tokenized exactly as the reference does)."""
        self.ended = True
        ids = self.tokenizer.text_ids(self.text)
        return self._release(ids, len(ids))

    def _release(self, ids: list[int], n: int) -> list[int]:
        out = ids[self.num_released:n] if n > self.num_released else []
        self.num_released = max(self.num_released, n)
        return out


def speakers(config: Qwen3TTSConfig) -> list[str]:
    return sorted(config.talker.spk_id)


def languages(config: Qwen3TTSConfig) -> list[str]:
    """"auto" and the checkpoint's languages (dialects are picked through their speakers)."""
    return ["auto", *sorted(k for k in config.talker.codec_language_id if "dialect" not in k)]


def resolve_speaker(config: Qwen3TTSConfig, name: str | None) -> str | None:
    """A served speaker's canonical name (case-insensitive), None for none; ValueError lists them."""
    if name is None or name == "":
        return None
    key = name.lower()
    if key not in config.talker.spk_id:
        served = ", ".join(speakers(config)) or "none (this checkpoint has no built-in speakers)"
        raise ValueError(f"unknown speaker {name!r}; served speakers: {served}")
    return key


def resolve_language(config: Qwen3TTSConfig, name: str | None) -> str:
    key = (name or "auto").lower()
    if key not in languages(config):
        raise ValueError(f"unknown language {name!r}; served languages: {', '.join(languages(config))}")
    return key


@dataclass
class Prompt:
    """``packed``: one int64 per prompt position (``talker.pack``); ``xvector_rows``: the positions
    whose codec track is the x-vector; ``text_track``: the text ids the decode rows take next, in
    order (after them: ``tts_eos`` once the text has ended, then ``tts_pad``)."""

    packed: list[int]
    text_track: list[int]
    xvector_rows: list[int] = field(default_factory=list)
    eos_pending: bool = True  # False when tts_eos is already in the prompt (non-streaming mode)


def build_prompt(config: Qwen3TTSConfig, text_ids: list[int], *, role_ids: list[int], language: str = "auto",
                 speaker: str | None = None, xvector: bool = False, instruct_ids: list[int] | None = None,
                 dual_track: bool = True) -> Prompt:
    """The reference's prompt for ``text_ids`` (``TextTokenizer.text_ids``; at least one id).

    ``speaker``: a built-in speaker (``resolve_speaker``); ``xvector``: a cloned voice's x-vector
    at the speaker position (the caller supplies the vector); neither: no speaker row.
    ``dual_track=False`` is the reference's ``non_streaming_mode`` (all text in the prompt).
    """
    t = config.talker
    if not text_ids:
        raise ValueError("build_prompt needs at least one text id")
    if speaker is not None and xvector:
        raise ValueError("a prompt takes a built-in speaker or an x-vector, not both")
    if xvector and not config.can_clone:
        raise ValueError("this checkpoint cannot clone a voice (it has no speaker encoder)")
    lang = resolve_language(config, language)
    spk = resolve_speaker(config, speaker)
    lang_id = None if lang == "auto" else t.codec_language_id[lang]
    dialect = t.spk_is_dialect.get(spk) if spk is not None else None
    if lang in ("chinese", "auto") and dialect:
        lang_id = t.codec_language_id[dialect]
    prefix = ([t.codec_nothink_id, t.codec_think_bos_id, t.codec_think_eos_id] if lang_id is None
              else [t.codec_think_id, t.codec_think_bos_id, lang_id, t.codec_think_eos_id])
    pad, bos, eos = config.tts_pad_token_id, config.tts_bos_token_id, config.tts_eos_token_id
    packed: list[int] = []
    if instruct_ids and config.supports_instruct:
        packed += [pack(i, NO_CODEC) for i in instruct_ids]
    packed += [pack(i, NO_CODEC) for i in role_ids]
    packed += [pack(pad, c) for c in prefix]
    xrows = []
    if spk is not None:
        packed.append(pack(pad, t.spk_id[spk]))
    elif xvector:
        xrows.append(len(packed))
        packed.append(pack(pad, XVECTOR))
    packed.append(pack(bos, t.codec_pad_id))
    if dual_track:
        packed.append(pack(text_ids[0], t.codec_bos_id))
        return Prompt(packed, list(text_ids[1:]), xrows)
    packed += [pack(i, t.codec_pad_id) for i in (*text_ids, eos)]
    packed.append(pack(pad, t.codec_bos_id))
    return Prompt(packed, [], xrows, eos_pending=False)
