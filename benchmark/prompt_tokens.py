"""Orpheus prompt lengths of the benchmark's texts, segment by segment, in dummy mode.

    python -m benchmark.prompt_tokens [--min-words 30] [--max-words 50]

The engine cuts each text into segments (``engine.segmenter`` with ``CoreConfig``'s settings)
and prompts Orpheus once per segment (``models.orpheus.prompt.build_prompt_ids``, voice tara).
A prompt's length sets what it costs of a step, so this prints the distribution with dummy
mode's ``PieceTokenizer`` (about Llama 3's lengths) beside the byte tokenizer dummy mode used
before (BOS + one id per UTF-8 byte), which the H200 runs up to run 17 carried.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

__all__ = ["segment_prompt_lengths", "main"]


def segment_prompt_lengths(texts: list[str]) -> dict[str, Any]:
    """Per segment: Orpheus prompt ids with ``PieceTokenizer`` and with the old byte tokenizer."""
    from engine.core import CoreConfig
    from models.orpheus.loader import PieceTokenizer
    from models.orpheus.prompt import build_prompt_ids

    cfg = CoreConfig()
    tok = PieceTokenizer()
    pieces: list[int] = []
    byte_ids: list[int] = []
    for text in texts:
        seg = cfg.new_segmenter()
        for s in seg.push(text) + seg.end():
            n = len(build_prompt_ids(tok, "tara", s.text))
            said = f"tara: {s.text}"  # what the tokenizer gets; the rest of the prompt is layout ids
            layout = n - len(tok.encode(said))
            pieces.append(n)
            byte_ids.append(layout + 1 + len(said.encode("utf-8")))  # BOS + one id per byte
    return {"texts": len(texts), "segments": len(pieces), "pieces": pieces, "bytes": byte_ids}


def _row(name: str, v: list[int]) -> str:
    a = np.asarray(v)
    return (f"{name:<16} {a.mean():>6.1f} {np.percentile(a, 50):>5.0f} {np.percentile(a, 90):>6.1f} "
            f"{a.max():>5d}")


def main(argv: list[str] | None = None) -> int:
    from benchmark.bench.prompts import filter_prompts, load_prompts

    ap = argparse.ArgumentParser(prog="python -m benchmark.prompt_tokens", description=__doc__.split("\n\n")[0])
    ap.add_argument("--min-words", type=int, default=30)
    ap.add_argument("--max-words", type=int, default=50)
    args = ap.parse_args(argv)
    try:
        texts = filter_prompts(load_prompts(), min_words=args.min_words, max_words=args.max_words)
    except ValueError as e:
        ap.error(str(e))
    r = segment_prompt_lengths(texts)
    print(f"{r['texts']} texts of {args.min_words}-{args.max_words} words, {r['segments']} segments "
          f"({r['segments'] / r['texts']:.2f} a text); Orpheus prompt ids per segment:")
    print(f"{'tokenizer':<16} {'mean':>6} {'p50':>5} {'p90':>6} {'max':>5}")
    print(_row("PieceTokenizer", r["pieces"]))
    print(_row("bytes (before)", r["bytes"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
