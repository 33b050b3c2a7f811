"""VoxCPM2 prompts: the text tokenizer and the prompt positions of each voice mode
(docs/models/voxcpm2.md, "Prompts and voices").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from models.voxcpm2.model import pack_prompt_patch

__all__ = ["AUDIO_START", "AUDIO_END", "REF_START", "REF_END", "Prompt", "TextTokenizer", "build_prompt",
           "max_patches", "normalize_text"]

AUDIO_START, AUDIO_END, REF_START, REF_END = 101, 102, 103, 104
CONTEXT_PATCHES = 3  # the reference's streaming_prefix_len (4) - 1


def _is_cjk(ch: str) -> bool:
    return "\u4e00" <= ch <= "\u9fff"


class TextTokenizer:
    """``ids(text)``: the reference's token ids for ``text`` (no special tokens)."""

    def __init__(self, tokenizer) -> None:  # a tokenizers.Tokenizer
        self.tok = tokenizer
        vocab = tokenizer.get_vocab()
        self.multichar = {t for t in vocab if len(t) >= 2 and all(_is_cjk(c) for c in t)}
        self.unk_id = vocab.get("<unk>", 0)

    @classmethod
    def from_dir(cls, d: str | Path) -> TextTokenizer:
        from tokenizers import Tokenizer

        f = Path(d) / "tokenizer.json"
        if not f.is_file():
            raise FileNotFoundError(f"{str(d)!r} has no tokenizer.json")
        return cls(Tokenizer.from_file(str(f)))

    def tokens(self, text: str) -> list[str]:
        out: list[str] = []
        for t in self.tok.encode(text, add_special_tokens=False).tokens:
            clean = t.replace("▁", "")
            out.extend(list(clean) if clean in self.multichar else [t])
        return out

    def ids(self, text: str) -> list[int]:
        out = []
        for t in self.tokens(text):
            i = self.tok.token_to_id(t)
            out.append(self.unk_id if i is None else i)
        return out


def normalize_text(text: str) -> str:
    """Newlines and runs of whitespace to one space (the reference's front end does this)."""
    return re.sub(r"\s+", " ", text.replace("\n", " "))


@dataclass(frozen=True)
class Prompt:
    ids: list[int]  # packed prompt positions
    num_ref_patches: int  # patches [0, R) of the slot's prompt features: the reference audio
    num_prompt_patches: int  # patches [R, R + C): the continuation audio
    context_patches: int  # the VAE stream is warmed with prompt patches [R + C - this, R + C)

    @property
    def num_patches(self) -> int:
        return self.num_ref_patches + self.num_prompt_patches


def build_prompt(text_ids: list[int], *, ref_patches: int = 0, prompt_patches: int = 0) -> Prompt:
    """The prompt positions for ``text_ids`` (the tokens of ``prompt_text + text`` in continuation
    mode, of ``text`` otherwise) with ``ref_patches`` reference and ``prompt_patches``
    continuation patches."""
    if ref_patches < 0 or prompt_patches < 0:
        raise ValueError("patch counts must be >= 0")
    ids: list[int] = []
    if ref_patches:
        ids += [REF_START, *(pack_prompt_patch(j) for j in range(ref_patches)), REF_END]
    ids += [*text_ids, AUDIO_START]
    ids += [pack_prompt_patch(ref_patches + j) for j in range(prompt_patches)]
    return Prompt(ids, ref_patches, prompt_patches, min(CONTEXT_PATCHES, prompt_patches))


def max_patches(target_ids: list[int], cap: int) -> int:
    """The reference's per-request patch limit: ``min(int(6 * len + 10), cap)``."""
    return min(int(len(target_ids) * 6.0 + 10), cap)
