"""Orpheus prompt layout, special token ids, voices and per-stream sampling options.

Prompt: ``[START_OF_HUMAN] + tokenizer("{voice}: {text}") (with BOS) + [END_OF_TEXT,
END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]``; the model then emits audio tokens and stops
with ``STOP_ID`` (end of speech).
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from engine.backend import OptionError

__all__ = [
    "START_OF_HUMAN", "END_OF_TEXT", "END_OF_HUMAN", "START_OF_AI", "START_OF_SPEECH",
    "STOP_ID", "END_OF_SPEECH", "AUDIO_BASE", "VOICES", "DEFAULT_VOICE", "DEFAULT_OPTIONS",
    "OPTION_RANGES", "TextTokenizer", "build_prompt_ids", "validate_options",
]

START_OF_HUMAN = 128259
END_OF_TEXT = 128009  # Llama 3 <|eot_id|>
END_OF_HUMAN = 128260
START_OF_AI = 128261
START_OF_SPEECH = 128257
STOP_ID = 128258  # end of speech: generation stops here
END_OF_SPEECH = STOP_ID
AUDIO_BASE = 128266  # first audio token id; 7 x 4096 audio ids follow

VOICES: tuple[str, ...] = ("tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe")
DEFAULT_VOICE = "tara"

DEFAULT_OPTIONS: dict[str, Any] = {
    "temperature": 0.6,
    "top_p": 0.8,
    "repetition_penalty": 1.3,
    "seed": None,
    "max_tokens": 4096,
}

# field -> (low, high, low_inclusive); all highs are inclusive. Documented in docs/orpheus.md.
OPTION_RANGES: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, 2.0, True),  # 0 = greedy
    "top_p": (0.0, 1.0, False),
    "repetition_penalty": (1.0, 2.0, True),
    "max_tokens": (7, 8192, True),  # generated tokens per segment; 7 tokens = one 2048-sample frame
}


class TextTokenizer(Protocol):
    def encode(self, text: str) -> Any: ...


def _encode(tokenizer: TextTokenizer, text: str) -> list[int]:
    out = tokenizer.encode(text)
    ids = getattr(out, "ids", out)  # tokenizers.Tokenizer returns an Encoding
    return [int(i) for i in ids]


def build_prompt_ids(tokenizer: TextTokenizer, voice: str, text: str) -> list[int]:
    """The Orpheus prompt ids for ``text`` spoken by ``voice``.

    The tokenizer is expected to add its BOS itself (Llama 3's post-processor does); if it did
    not, and it declares a ``bos_token_id``, the BOS is prepended so the layout always holds.
    """
    ids = _encode(tokenizer, f"{voice}: {text}")
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and (not ids or ids[0] != bos):
        ids = [int(bos)] + ids
    return [START_OF_HUMAN, *ids, END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH]


def _range_text(name: str) -> str:
    low, high, low_inclusive = OPTION_RANGES[name]
    fmt = (lambda x: str(int(x))) if name == "max_tokens" else (lambda x: f"{x:g}")
    return f"{'[' if low_inclusive else '('}{fmt(low)}, {fmt(high)}]"


def validate_options(voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Check a stream's voice and sampling options; return them with defaults filled in.

    Raises ``OptionError("unknown_voice", ...)`` listing the voices, or
    ``OptionError("invalid_option", ...)`` naming the field and its range.
    """
    voice = DEFAULT_VOICE if voice is None else voice
    if voice not in VOICES:
        raise OptionError("unknown_voice", f"unknown voice {voice!r}; voices: {', '.join(VOICES)}")
    unknown = sorted(set(options) - set(DEFAULT_OPTIONS))
    if unknown:
        raise OptionError(
            "invalid_option", f"unknown option {unknown[0]!r}; options: {', '.join(DEFAULT_OPTIONS)}"
        )
    out = dict(DEFAULT_OPTIONS)
    for name, value in options.items():
        if value is None and name == "seed":
            continue
        if name == "seed":
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
                raise OptionError("invalid_option", f"seed must be an integer in [0, 2^63), got {value!r}")
            out[name] = value
            continue
        is_int = name == "max_tokens"
        ok_type = isinstance(value, int) if is_int else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok_type or not math.isfinite(value):
            kind = "an integer" if is_int else "a number"
            raise OptionError("invalid_option", f"{name} must be {kind} in {_range_text(name)}, got {value!r}")
        low, high, low_inclusive = OPTION_RANGES[name]
        if not ((value >= low if low_inclusive else value > low) and value <= high):
            raise OptionError("invalid_option", f"{name} must be in {_range_text(name)}, got {value!r}")
        out[name] = int(value) if is_int else float(value)
    return voice, out
