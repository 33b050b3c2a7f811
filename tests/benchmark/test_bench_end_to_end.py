"""``voxgate bench`` end to end against the real ``voxgate serve`` (synthetic tones, then the
embedded voice with --asr)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from benchmark.bench.cli import main
from benchmark.bench.server_stats import fetch_totals

pytestmark = pytest.mark.slow


def test_bench_two_streams_against_synthetic_server(server_factory: Any, tmp_path: Any,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Two concurrent word-by-word streams: both finish with audio, engine timestamps arrive,
    the JSON holds their figures."""
    server = server_factory("--model", "synthetic", "--debug-timestamps")
    server_url = server.ws_url
    out = tmp_path / "bench.json"
    code = main(["--url", server.ws_url, "-c", "2", "-n", "2", "--max-words", "12",
                 "--token-rate", "50", "--json", str(out), "--no-progress"])
    assert code == 0, capsys.readouterr()
    level = json.loads(out.read_text())["levels"][0]
    assert level["num_streams"] == 2 and level["num_failed"] == 0
    assert level["ttfa_ms"]["count"] == 2 and level["audio_s_total"] > 0
    for stream in level["streams"]:
        assert stream["num_chunks"] == len(stream["chunk_t"]) > 0
        assert stream["ttfa_s"] > 0
        assert len(stream["chunk_engine_t"]) == stream["num_chunks"]  # --debug-timestamps
    server = level["extra"]["server"]  # the engine's counters from /metrics, before and after
    assert server["window_s"] > 0 and server["steps"] >= 0 and 0 <= server["busy_fraction"] <= 1
    assert "server_timeline_t0" in level["extra"]  # /metrics was polled during the level
    lag = level["extra"]["client_loop_lag_ms"]  # the client's own event loop, ticked every 10 ms
    assert lag["count"] > 0 and 0 <= lag["p50"] <= lag["p99"] <= lag["max"]
    totals = asyncio.run(fetch_totals(server_url))[1]
    assert totals["gc_frozen_objects"] > 1000  # the engine froze its start-up heap
    assert totals["gc_collections"] >= 0 and totals["gc_pause_s"] >= 0
    for point in level["extra"]["server_timeline"]:  # (one report a second: a short level has few)
        assert point["t_s"] > 0 and point["steps_per_s"] >= 0 and "running_jobs" in point


def test_bench_asr_against_embedded_voice(voxgate_server: Any, tmp_path: Any,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """--asr transcribes what the embedded voice said and reports a low word error rate."""
    from benchmark.asr import INTELLIGIBILITY_SENTENCES

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(INTELLIGIBILITY_SENTENCES[:2]) + "\n")
    out = tmp_path / "bench.json"
    code = main(["--url", voxgate_server.ws_url, "-c", "1", "-n", "2", "--prompts",
                 str(prompts), "--asr", "--option", "seed=0", "--json", str(out),
                 "--no-progress"])
    assert code == 0, capsys.readouterr()
    asr = json.loads(out.read_text())["asr"]
    assert asr["streams"] == 2
    assert asr["wer_word_weighted"] <= 0.25, asr


def test_bench_counts_refusals_against_a_server_at_capacity(server_factory: Any, tmp_path: Any,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A synthetic server that admits one stream at a time, refusing the rest: three workers,
    six streams; the refused ones are counted as refused (with the server's retry hint), not
    as failed, and every admitted stream finishes."""
    server = server_factory("--model", "synthetic", "--admission", "refuse",
                            "--admission-initial-capacity", "1")
    out = tmp_path / "bench.json"
    code = main(["--url", server.ws_url, "-c", "3", "-n", "6", "--max-words", "6", "--json", str(out),
                 "--no-progress"])
    assert code == 0, capsys.readouterr()
    level = json.loads(out.read_text())["levels"][0]
    assert level["num_streams"] == 6 and level["num_refused"] >= 1
    assert level["num_failed_not_refused"] == 0 and level["errors_by_code"] == {"capacity": level["num_refused"]}
    assert level["num_ok"] + level["num_refused"] == 6
    assert all(s["retry_after_s"] > 0 for s in level["streams"] if s["is_refused"])


def test_bench_sample_rate_asks_each_stream_for_that_rate(server_factory: Any, tmp_path: Any,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """--sample-rate 16000: every stream asks for 16 kHz and is scored at it, so its audio
    seconds equal those of the same text at the model's rate (24 kHz)."""
    server = server_factory("--model", "synthetic")
    audio = {}
    for rate in (None, 16000):
        out = tmp_path / f"bench_{rate}.json"
        args = ["--url", server.ws_url, "-c", "1", "-n", "2", "--max-words", "8", "--json", str(out),
                "--no-progress", "--option", "seed=0"]
        code = main(args + (["--sample-rate", str(rate)] if rate else []))
        assert code == 0, capsys.readouterr()
        level = json.loads(out.read_text())["levels"][0]
        assert level["num_failed"] == 0
        audio[rate] = [s["audio_s"] for s in level["streams"]]
        assert all(s["sample_rate"] == (rate or 24000) for s in level["streams"])
    assert audio[16000] == pytest.approx(audio[None], abs=2e-3)
