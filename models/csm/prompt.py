"""CSM prompts: a conversation's turns as packed ids (the reference's format), and the text
tokenizer (docs/models/csm.md, "Voices, speakers and context").
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from models.csm.config import CsmConfig
from models.csm.model import pack_pool

__all__ = ["StandInTokenizer", "TextTokenizer", "Tokenizer", "Turn", "ZERO_ROW", "build_prompt"]

ZERO_ROW = 0  # the pool's all-zero frame: <|audio_eos|>


class Tokenizer(Protocol):
    def ids(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added."""
        ...


class TextTokenizer:
    """The checkpoint's Llama 3 tokenizer (``tokenizer.json``, through ``tokenizers``)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    @classmethod
    def from_dir(cls, d: str | Path) -> TextTokenizer:
        from tokenizers import Tokenizer as HFTokenizer

        f = Path(d) / "tokenizer.json"
        if not f.is_file():
            raise FileNotFoundError(f"model directory {str(d)!r} has no tokenizer.json")
        return cls(HFTokenizer.from_file(str(f)))

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids


class StandInTokenizer:
    """``--load-format dummy`` without tokenizer files: Llama 3's pre-tokenizer pieces
    (``models.orpheus.loader.PieceTokenizer``), each one id (a hash below the special ids):
    about Llama 3's token counts for English, deterministic, no files."""

    def __init__(self, num_text_ids: int = 128_000) -> None:
        from models.orpheus.loader import PieceTokenizer

        self._pieces = PieceTokenizer()
        self._span = num_text_ids

    def ids(self, text: str) -> list[int]:
        return [zlib.crc32(p.encode("utf-8")) % self._span for p in self._pieces.pieces(text)]


@dataclass(frozen=True)
class Turn:
    """One turn: its speaker id, its text, and (context turns) the pool rows of its frames."""

    speaker: int
    text: str
    rows: tuple[int, ...] | None = None


def _turn_ids(tokenizer: Tokenizer, config: CsmConfig, turn: Turn) -> list[int]:
    ids = [config.bos_token_id, *tokenizer.ids(f"[{turn.speaker}]{turn.text}"), config.eos_token_id]
    if turn.rows is not None:
        ids += [pack_pool(r) for r in turn.rows] + [pack_pool(ZERO_ROW)]
    return ids


def build_prompt(tokenizer: Tokenizer, config: CsmConfig, turns: list[Turn]) -> list[int]:
    """The packed prompt ids of ``turns`` (context turns first, the turn to speak last)."""
    out: list[int] = []
    for turn in turns:
        out += _turn_ids(tokenizer, config, turn)
    return out

