"""``voxgate bench`` arguments: validation messages naming the flag, defaults, and whole runs
against a fake server (summary, JSON, plots) and an unreachable one."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from benchmark.bench.cli import main, parse_config
from benchmark.bench.config import BenchConfig


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        parse_config(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, flag, words", [
    (["-c", "0"], "--concurrency", ">= 1"),
    (["-c", "4,x"], "--concurrency", "integer"),
    (["--rate", "-1"], "--rate", "> 0"),
    (["--rate", "nan"], "--rate", "finite"),
    (["-c", "4", "--rate", "2"], "--rate", "not allowed"),
    (["-n", "10", "--duration", "5"], "--duration", "not allowed"),
    (["--duration", "0"], "--duration", "> 0"),
    (["--start-buffer-ms", "20000"], "--start-buffer-ms", "[0, 10000]"),
    (["--min-on-time", "1.5"], "--min-on-time", "(0, 1]"),
    (["--target", "grpc"], "--target", "invalid choice"),
    (["--format", "mp3"], "--format", "invalid choice"),
    (["--option", "seed"], "--option", "key=value"),
    (["--http-extra", "[1]"], "--http-extra", "JSON object"),
    (["--target", "openai", "--token-rate", "10"], "--token-rate", "native target"),
    (["--url", "http://x:1/v1/stream"], "--url", "ws://"),
    (["--target", "openai", "--url", "ws://x"], "--url", "http://"),
    (["--min-words", "50", "--max-words", "10"], "--max-words", "--min-words"),
    (["--search-start", "64", "--search-max", "8", "--search"], "--search-start", "--search-max"),
    (["--prompts", "/nonexistent/p.txt"], "--prompts", "cannot read"),
    (["--min-words", "500"], "--min-words", "no prompt has between 500"),
    (["--overload", "0"], "--overload", "(0, 10]"),
    (["--overload", "2", "-c", "4,8"], "--overload", "exactly one"),
    (["--overload", "2"], "--overload", "--search"),
])
def test_bad_arguments_exit_2_naming_the_flag(capsys: pytest.CaptureFixture[str], argv: list[str],
                                              flag: str, words: str) -> None:
    """Every invalid argument is refused by argparse with a message naming the flag and range."""
    err = _error(capsys, argv)
    assert flag in err and words in err, err


def test_defaults_and_parsing() -> None:
    """No load flag means one stream at a time; lists, options and extras are parsed."""
    cfg = parse_config([])
    assert cfg.concurrency == [1] and cfg.mode == "concurrency"
    assert cfg.url == "ws://127.0.0.1:8000/v1/stream" and cfg.start_buffer_ms == 100
    cfg = parse_config(["-c", "1,8,32", "--option", "seed=3", "--option", "style=calm",
                        "--token-rate", "40", "--json", "out.json"])
    assert cfg.concurrency == [1, 8, 32]
    assert cfg.options == {"seed": 3, "style": "calm"}
    assert cfg.token_rate == 40 and cfg.json_path == "out.json"
    cfg = parse_config(["--target", "generate", "--rate", "0.5,2", "--http-extra", '{"a": 1}'])
    assert cfg.url == "http://127.0.0.1:8000" and cfg.rate == [0.5, 2.0]
    assert cfg.http_extra == {"a": 1} and cfg.mode == "rate"


def test_requests_per_level_defaults() -> None:
    """Count-bounded levels default to max(20, 3 x concurrency) or 30 s of arrivals."""
    assert BenchConfig(concurrency=[4]).requests_for(4) == 20
    assert BenchConfig(concurrency=[64]).requests_for(64) == 192
    assert BenchConfig(rate=[2.0]).requests_for(2.0) == 60
    assert BenchConfig(concurrency=[4], num_requests=7).requests_for(4) == 7
    assert BenchConfig(concurrency=[4], duration_s=10).requests_for(4) is None


def test_config_validates_without_argparse() -> None:
    """BenchConfig itself raises ValueError (for programmatic use), naming the flag."""
    with pytest.raises(ValueError, match="--concurrency"):
        BenchConfig(concurrency=[0])
    with pytest.raises(ValueError, match="only one of"):
        BenchConfig(concurrency=[1], search=True)


@contextmanager
def _server_thread(factory: Any) -> Iterator[str]:
    """Run an async-context-manager fake server on its own loop in a thread."""
    ready: list[str] = []
    started = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        async with factory() as url:
            ready.append(url)
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield ready[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def test_main_runs_a_sweep_and_writes_json_and_plots(fakes: Any, tmp_path: Any,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A two-level sweep with one failing prompt: exit 0, summary with errors by code, JSON with
    every level and stream, three PNGs."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("# comment\none two three\nfour five\nsix [[fail]] seven\n")
    out = tmp_path / "out.json"
    plots = tmp_path / "plots"
    with _server_thread(fakes.native_server) as url:
        code = main(["--url", url, "-c", "1,3", "-n", "6", "--prompts", str(prompts),
                     "--token-rate", "500", "--warmup", "1", "--json", str(out),
                     "--plots", str(plots), "--no-progress"])
    assert code == 0
    text = capsys.readouterr().out
    assert "errors at 1: model_error: 2" in text and "capacity" in text
    data = json.loads(out.read_text())
    assert [lv["level"] for lv in data["levels"]] == [1, 3]
    assert all(len(lv["streams"]) == 6 for lv in data["levels"])
    assert data["levels"][0]["errors_by_code"] == {"model_error": 2}
    assert data["capacity"] is None  # 4 of 6 on time fails the 99% criterion
    assert data["target"]["model"] == "fake"
    assert data["prompts"]["prompts"] == 3
    assert sorted(p.name for p in plots.iterdir()) == ["timeline.png", "ttfa.png",
                                                       "viability.png"]


def test_overload_levels_multiply_the_capacity() -> None:
    """Concurrency levels are whole streams, rate levels are not rounded; repeats go."""
    c = BenchConfig(concurrency=[480], overload=[1, 1.5, 2, 2.0001])
    assert c.overload_levels(480) == [480.0, 720.0, 960.0]
    r = BenchConfig(rate=[3.0], overload=[1.5])
    assert r.overload_levels(3.0) == [4.5]


def test_main_overload_sweep_counts_refusals_apart(fakes: Any, tmp_path: Any,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """-c 2 --overload 1.5,2: levels 2, 3 and 4; a refused prompt is counted as refused (not
    failed), a queued one as queued; the JSON's overload block compares goodput with level 2."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("one two three\nfour [[refuse]] five\nsix [[wait]] seven\n")
    out = tmp_path / "out.json"
    with _server_thread(fakes.native_server) as url:
        code = main(["--url", url, "-c", "2", "-n", "6", "--overload", "1.5,2", "--prompts",
                     str(prompts), "--json", str(out), "--no-progress"])
    assert code == 0
    text = capsys.readouterr().out
    assert "admission at 2: 2 refused" in text and "2 queued" in text
    assert "overload 1.5x (3): goodput" in text and "overload 2x (4)" in text
    data = json.loads(out.read_text())
    assert [lv["level"] for lv in data["levels"]] == [2, 3, 4]
    lv = data["levels"][0]
    assert (lv["num_refused"], lv["num_queued"], lv["num_failed_not_refused"], lv["num_failed"]) == (2, 2, 0, 2)
    assert lv["on_time_fraction_admitted"] == 1.0 and lv["goodput_audio_s_per_s"] > 0
    assert [s["retry_after_s"] for s in lv["streams"] if s["is_refused"]] == [0.01, 0.01]
    assert data["overload"]["base"] == 2
    assert [row["level"] for row in data["overload"]["levels"]] == [3, 4]
    assert all(row["goodput_vs_base"] > 0 for row in data["overload"]["levels"])


def test_main_unreachable_target_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    """A server that is not there is one clear line on stderr and exit status 1."""
    assert main(["--url", "ws://127.0.0.1:9/v1/stream", "--no-progress"]) == 1
    assert "cannot reach native target" in capsys.readouterr().err


@pytest.mark.parametrize("argv, missing, words", [
    (["--plots", "out"], {"matplotlib"}, "--plots needs matplotlib"),
    (["--asr"], {"pocketsphinx"}, "--asr needs pocketsphinx"),
    (["--target", "openai"], {"httpx"}, "--target openai needs httpx"),
    (["--plots", "out", "--asr"], {"matplotlib", "pocketsphinx"},
     "--plots needs matplotlib and --asr needs pocketsphinx"),
])
def test_a_missing_extra_is_refused_before_the_benchmark_runs(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str], missing: set[str], words: str) -> None:
    """An option whose optional module is not installed exits 2 at once, naming the bench extra."""
    import importlib.util

    from benchmark.bench import cli

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name in missing else real(name))
    monkeypatch.setattr("benchmark.bench.runner.run", lambda config: pytest.fail("the benchmark ran"))
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert words in err and 'pip install -e ".[bench]"' in err


def test_no_extra_is_asked_for_when_none_is_needed() -> None:
    """The native target without plots or ASR needs no optional module."""
    from benchmark.bench.cli import missing_extras

    assert missing_extras(BenchConfig(), find_spec=lambda name: None) == []
