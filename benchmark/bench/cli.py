"""``voxgate bench``'s command line, mapped onto ``BenchConfig``; ``main(argv)`` is what ``voxgate``
dispatches to."""

from __future__ import annotations

import argparse
import importlib.util
import json
from typing import Any, Callable

from benchmark.bench.config import DEFAULT_URLS, FORMATS, BenchConfig
from benchmark.bench.prompts import filter_prompts, load_prompts
from benchmark.args import list_type, number_type
from benchmark.bench.targets import TARGETS

__all__ = ["build_parser", "parse_config", "main", "missing_extras"]

BENCH_EXTRA = 'pip install -e ".[bench]"'


def _option(text: str) -> tuple[str, Any]:
    """``key=value``; the value is parsed as JSON when it can be (numbers, booleans)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def _json_map(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object, e.g. '{\"stream\": true}'")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="voxgate bench",
        description="Load-generating latency benchmark for streaming TTS servers "
                    "(docs/benchmark.md).")
    t = p.add_argument_group("target")
    t.add_argument("--target", choices=TARGETS, default="native",
                   help="native WebSocket, OpenAI-style POST /v1/audio/speech, or multipart "
                        "POST /generate (default: native)")
    t.add_argument("--url", help="server URL (default: " + ", ".join(
        f"{k}: {v}" for k, v in DEFAULT_URLS.items()) + ")")
    t.add_argument("--voice", metavar="NAME")
    t.add_argument("--format", choices=FORMATS, default="pcm_s16le", help="native: PCM format")
    t.add_argument("--sample-rate", metavar="HZ", type=number_type(int, 8000, 48000), default=None,
                   help="native: the output rate each stream asks for (the gateway resamples; "
                        "default: the model's)")
    t.add_argument("--option", dest="options", type=_option, action="append", default=[],
                   metavar="KEY=VALUE", help="native: a stream option (repeatable), e.g. seed=1")
    t.add_argument("--streams-per-connection", metavar="N", type=number_type(int, 1, 1024), default=1,
                   help="native: streams sharing one WebSocket (default 1)")
    t.add_argument("--http-model", metavar="NAME", help="openai: the 'model' field")
    t.add_argument("--http-response-format", choices=("pcm", "wav"), default="pcm",
                   help="openai: body format (default pcm)")
    t.add_argument("--http-sample-rate", metavar="HZ", type=number_type(int, 8000, 192000), default=24000,
                   help="openai with pcm: the body's sample rate in Hz (default 24000)")
    t.add_argument("--http-extra", type=_json_map, default={}, metavar="JSON",
                   help="extra request fields (openai: JSON body; generate: form fields)")

    ld = p.add_argument_group("load")
    mode = ld.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", "-c", type=list_type(number_type(int, 1)), default=[],
                      metavar="N[,N...]", help="fixed concurrency levels to sweep (default 1)")
    mode.add_argument("--rate", type=list_type(number_type(float, 0, lo_open=True)), default=[],
                      metavar="R[,R...]", help="open-loop arrival rates in streams/s to sweep")
    mode.add_argument("--search", action="store_true",
                      help="search for capacity: double the concurrency, then bisect")
    ld.add_argument("--search-start", metavar="N", type=number_type(int, 1), default=1)
    ld.add_argument("--search-max", metavar="N", type=number_type(int, 1), default=1024)
    ld.add_argument("--overload", type=list_type(number_type(float, 0, 10, lo_open=True)), default=[],
                    metavar="F[,F...]",
                    help="then offer load beyond capacity: levels at these multiples of the "
                         "capacity --search found, or of the one -c/--rate level given, e.g. "
                         "1.5,2 (refused and queued streams are counted apart from failures)")
    ld.add_argument("--arrival-shape", metavar="K", type=number_type(float, 0, lo_open=True), default=1.0,
                    help="gamma shape of inter-arrival gaps with --rate (1 = Poisson)")
    bound = ld.add_mutually_exclusive_group()
    bound.add_argument("--requests", "-n", metavar="N", type=number_type(int, 1), dest="num_requests",
                       help="streams per level (default: max(20, 3 x concurrency), or 30 s of "
                            "arrivals)")
    bound.add_argument("--duration", metavar="S", type=number_type(float, 0, lo_open=True), dest="duration_s",
                       help="seconds per level during which new streams start")
    ld.add_argument("--warmup", metavar="N", type=number_type(int, 0), default=0,
                    help="streams run before measuring, not counted (default 0)")
    ld.add_argument("--ramp", metavar="S", type=number_type(float, 0), default=0.0, dest="ramp_s",
                    help="concurrency mode: spread first starts over this many seconds")
    ld.add_argument("--seed", metavar="N", type=int, default=0)
    ld.add_argument("--timeout", metavar="S", type=number_type(float, 0, lo_open=True), default=120.0,
                    dest="timeout_s", help="per-stream limit in seconds (default 120)")

    tx = p.add_argument_group("text")
    tx.add_argument("--prompts", metavar="FILE", dest="prompts_path",
                    help="prompt file, one per line (default: the project's set)")
    tx.add_argument("--min-words", metavar="N", type=number_type(int, 0), default=0)
    tx.add_argument("--max-words", metavar="N", type=number_type(int, 1))
    tx.add_argument("--token-rate", metavar="R", type=number_type(float, 0, lo_open=True),
                    help="stream text word by word at this many words/s (native only); "
                         "default: all at once")

    sc = p.add_argument_group("scoring")
    sc.add_argument("--start-buffer-ms", metavar="MS", type=number_type(float, 0, 10_000), default=100.0,
                    help="simulated player's start-up buffer (default 100)")
    sc.add_argument("--ttfa-p90-max-ms", metavar="MS", type=number_type(float, 0, lo_open=True), default=300.0)
    sc.add_argument("--min-on-time", metavar="FRACTION", type=number_type(float, 0, 1, lo_open=True), default=0.99)
    sc.add_argument("--asr", action="store_true",
                    help="transcribe returned audio with pocketsphinx and report word error rate")
    sc.add_argument("--asr-max-streams", metavar="N", type=number_type(int, 1), default=20)

    out = p.add_argument_group("output")
    out.add_argument("--json", dest="json_path", metavar="PATH", help="write every figure here")
    out.add_argument("--plots", dest="plots_dir", metavar="DIR", help="write PNG plots here")
    out.add_argument("--timeline-streams", metavar="N", type=number_type(int, 0), default=8)
    out.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def missing_extras(config: BenchConfig,
                   find_spec: Callable[[str], Any] | None = None) -> list[str]:
    """"--plots needs matplotlib" for each optional module the chosen options need and this
    environment lacks (all of them in the ``bench`` extra)."""
    needs = []
    if config.plots_dir is not None:
        needs.append(("--plots", "matplotlib"))
    if config.asr:
        needs.append(("--asr", "pocketsphinx"))
    if config.target != "native":
        needs.append((f"--target {config.target}", "httpx"))
    find = find_spec or importlib.util.find_spec
    return [f"{flag} needs {module}" for flag, module in needs if find(module) is None]


def parse_config(argv: list[str] | None) -> BenchConfig:
    """Parse and validate; exits with status 2 and a message naming the flag on bad input."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    kwargs = vars(ns)
    kwargs["options"] = dict(kwargs["options"])
    try:
        config = BenchConfig(**kwargs)
    except ValueError as exc:
        parser.error(str(exc))
    try:  # fail now, not after connecting, on a missing file or an empty length band
        filter_prompts(load_prompts(config.prompts_path), min_words=config.min_words,
                       max_words=config.max_words)
    except OSError as exc:
        parser.error(f"--prompts: cannot read {config.prompts_path}: {exc.strerror}")
    except ValueError as exc:
        parser.error(f"--prompts/--min-words/--max-words: {exc}")
    missing = missing_extras(config)
    if missing:  # now, not after the whole benchmark has run
        parser.error(f"{' and '.join(missing)}, not installed here: {BENCH_EXTRA}")
    return config


def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    from benchmark.bench.runner import run

    return run(config)


if __name__ == "__main__":
    raise SystemExit(main())
