"""Text -> entries (words, pauses) as moshi 0.2.13's ``script_to_entries`` makes them, whole or
streamed (``EntryStream``); the cleaning and the deviations (long words split, unknown scripts
refused): docs/models/kyutai_tts.md, "How a turn runs".
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from models.kyutai_tts.machine import MAIN, Entry

__all__ = ["TextTokenizer", "EntryStream", "script_to_entries", "clean"]

_EVENT = re.compile(r"(?:<break\s+time=\"([0-9]+(?:.[0-9]*)?)s\"\s*/?>)|(?:\s+)")


def clean(text: str) -> str:
    return text.replace("\u2019", "'").replace(":", " ").replace("(", "").replace(")", "")


class TextTokenizer:
    """The checkpoint's SentencePiece model (``tokenizer_spm_8k_en_fr_audio.model``)."""

    def __init__(self, processor: Any) -> None:
        self.sp = processor
        self.unk_id = int(processor.unk_id())
        self.vocab_size = int(processor.get_piece_size())
        self._bare = {i for i in range(self.vocab_size) if processor.id_to_piece(i) == "\u2581"}

    @classmethod
    def from_file(cls, path: str | Path) -> TextTokenizer:
        import sentencepiece

        return cls(sentencepiece.SentencePieceProcessor(model_file=str(path)))

    def encode(self, word: str) -> list[int]:
        return list(self.sp.encode(word))

    def is_unknown(self, ids: list[int]) -> bool:
        """Every token is <unk> (or the bare word marker): the tokenizer cannot write this word."""
        return bool(ids) and all(i == self.unk_id or i in self._bare for i in ids) and self.unk_id in ids


def _word_entries(tok: TextTokenizer, word: str, *, speaker_token: bool, padding_between: int,
                  max_word_tokens: int) -> list[Entry]:
    ids = tok.encode(word)
    if tok.is_unknown(ids):
        raise ValueError(f"unsupported text: the model's tokenizer cannot write {word!r}")
    if speaker_token:
        ids.insert(0, MAIN)
    out = []
    for i in range(0, max(len(ids), 1), max_word_tokens):
        part = ids[i:i + max_word_tokens]
        pad = max(0, padding_between + len(part) - 1) if padding_between > 0 else 0
        out.append(Entry(tokens=tuple(part), padding=pad, text=word if i == 0 else ""))
    return out


class EntryStream:
    """Streamed text of one turn -> entries, as ``script_to_entries([whole text])`` gives them."""

    def __init__(self, tokenizer: TextTokenizer, *, multi_speaker: bool = True, padding_between: int = 1,
                 frame_rate: float = 12.5, max_word_tokens: int = 32) -> None:
        self.tok = tokenizer
        self.multi_speaker, self.padding_between = multi_speaker, padding_between
        self.frame_rate, self.max_word_tokens = frame_rate, max_word_tokens
        self.buffer = ""
        self.first_word = True
        self.ended = False

    def _word(self, word: str) -> list[Entry]:
        speaker = self.multi_speaker and self.first_word
        self.first_word = False
        return _word_entries(self.tok, word, speaker_token=speaker, padding_between=self.padding_between,
                             max_word_tokens=self.max_word_tokens)

    def _drain(self, final: bool) -> list[Entry]:
        """Entries of the words (and breaks) the buffer holds, complete ones only unless ``final``."""
        buf = self.buffer
        limit = len(buf)
        if not final:  # a "<" with no ">" after it may be a break tag still arriving: hold it back
            lt = buf.find("<", buf.rfind(">") + 1)
            if lt >= 0:
                limit = lt
        out: list[Entry] = []
        pos = 0
        while pos < len(buf):
            m = _EVENT.search(buf, pos)
            if m is None or m.end() > limit:
                break
            if m.start() > pos:
                out += self._word(buf[pos:m.start()])
            if m.group(1):
                out.append(Entry(tokens=(), padding=int(round(float(m.group(1)) * self.frame_rate))))
            pos = m.end()
        rest = buf[pos:]
        if final and rest:
            out += self._word(rest)
            rest = ""
        self.buffer = rest
        return out

    def push(self, text: str) -> list[Entry]:
        """More text: the entries now complete."""
        if self.ended:
            raise ValueError("EntryStream.push after end()")
        self.buffer += clean(text)
        return self._drain(final=False)

    def flush(self) -> list[Entry]:
        """Release what is buffered, a word cut short included (the turn goes on)."""
        return self._drain(final=True)

    def end(self) -> list[Entry]:
        """The turn's text is complete: the remaining entries."""
        self.ended = True
        return self._drain(final=True)


def script_to_entries(tokenizer: TextTokenizer, text: str, *, multi_speaker: bool = True, padding_between: int = 1,
                      frame_rate: float = 12.5, max_word_tokens: int = 32) -> list[Entry]:
    """A whole turn's entries (one ``script`` line of the reference)."""
    s = EntryStream(tokenizer, multi_speaker=multi_speaker, padding_between=padding_between, frame_rate=frame_rate,
                    max_word_tokens=max_word_tokens)
    return s.push(text) + s.end()
