"""The gateway-overhead benchmark's pure parts: /proc CPU accounting, the process tree, and the
window summary on hand-made traces."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from benchmark.bench.trace import StreamTrace
from benchmark.gateway_overhead import OverheadConfig, _summarize, descendants, process_cpu_s


def test_process_cpu_grows_with_work_and_is_zero_for_missing_pid() -> None:
    """CPU seconds from /proc rise when this process computes; a dead pid reads 0."""
    before = process_cpu_s(os.getpid())
    sum(i * i for i in range(2_000_000))
    assert process_cpu_s(os.getpid()) > before
    assert process_cpu_s(2**22 + 12345) == 0.0


def test_descendants_finds_a_grandchild() -> None:
    """A child's child is found below this process."""
    # The shell starts `sleep` in the background, then says so: reading that line synchronises.
    child = subprocess.Popen(["sh", "-c", "sleep 30 & echo started; wait"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "started"
        below = descendants(child.pid)
        assert len(below) == 1
        assert set(below) | {child.pid} <= set(descendants(os.getpid()))
    finally:
        for pid in descendants(child.pid):
            os.kill(pid, signal.SIGTERM)
        child.kill()
        child.wait()


def test_summarize_counts_only_chunks_in_window() -> None:
    """Added latency uses only chunks received inside the window; CPU per stream divides the
    gateway's CPU by window seconds and streams."""
    tr = StreamTrace(stream_id="a", prompt_index=0, text="x", sample_rate=1000)
    for t in (0.5, 1.0, 1.5, 2.0, 3.5):
        tr.add_chunk(t, 40, engine_t=t - 0.002)
    tr.done_reason, tr.t_done = "end", 4.0
    a = {"t": 1.0, "load1": 0.5, "gateway": 10.0, "engine": 1.0, "client": 2.0}
    b = {"t": 3.0, "load1": 0.5, "gateway": 10.5, "engine": 1.2, "client": 2.4}
    row = _summarize([tr], a, b, [(2.0, 0.001)], num_streams=1)
    assert row["chunks_in_window"] == 3
    assert row["added_latency_ms"]["p50"] == pytest.approx(2.0)
    assert row["gateway_cpu_per_stream_pct_core"] == pytest.approx(25.0)
    assert row["streams_active_whole_window"] == 1
    assert row["cpu_cores"]["engine"] == pytest.approx(0.1)


def test_config_rejects_bad_levels() -> None:
    """Levels must be positive and the window non-empty."""
    with pytest.raises(ValueError):
        OverheadConfig(streams=(0,))
    with pytest.raises(ValueError):
        OverheadConfig(measure_s=0)


def test_client_processes_default_to_one_per_250_streams_within_a_quarter_of_cpus(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Automatic client processes: ceil(streams / 250), at most cpus // 4, at least 1."""
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    cfg = OverheadConfig()
    assert [cfg.num_client_procs(n) for n in (1, 100, 500, 1000, 5000)] == [1, 1, 2, 4, 4]
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert cfg.num_client_procs(1000) == 1
    assert OverheadConfig(client_procs=3).num_client_procs(2) == 2
    with pytest.raises(ValueError):
        OverheadConfig(client_procs=-1)
