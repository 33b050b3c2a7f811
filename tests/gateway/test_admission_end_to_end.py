"""Admission end to end: the real ``voxgate serve`` on port 0 with the synthetic model and a
capacity of one stream forced by ``--admission-initial-capacity 1``; a second stream is refused
(``--admission refuse``) or waits for the first to end (``--admission queue``)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any, Callable

import pytest

from gateway.client import ClientStream, StreamFailed, VoxgateClient
from tests.conftest import VoxgateServer

pytestmark = pytest.mark.slow

TEXT = "One two three, four five six."


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


async def _until(fetch: Callable[[], str], ok: Callable[[str], bool], timeout_s: float = 30.0) -> str:
    """The engine reports its figures once a second: read until they show (or fail)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = await asyncio.to_thread(fetch)
        if ok(text) or time.monotonic() > deadline:
            return text
        await asyncio.sleep(0.2)


async def _speak(stream: ClientStream) -> None:
    await stream.send_text(TEXT)
    await stream.end()


async def _first_audio(stream: ClientStream) -> dict[str, Any]:
    async for msg in stream.messages():
        if msg["type"] == "audio":
            return msg
    raise AssertionError(f"no audio: {stream.error}")


async def _refuse_scenario(server: VoxgateServer) -> dict[str, Any]:
    async with VoxgateClient.connect(server.ws_url) as client:
        a = await client.start()
        await a.send_text(TEXT)  # no end yet: a holds the one place until it ends
        await _first_audio(a)
        b = await client.start()
        await _speak(b)
        b_msgs = [msg async for msg in b.messages()]
        await a.end()
        await a.collect()
        c = await client.start()  # a is done: room again
        await _speak(c)
        c_audio = await c.collect()
    metrics = await _until(lambda: _get(server.base_url + "metrics"), lambda t: _refused(t) == 1)
    return {"b": b_msgs, "a_done": a.done, "c_audio": c_audio, "metrics": metrics}


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def _refused(metrics: str) -> float:
    """Capacity refusals by the engine and by the gateway (which refuses at its door once the
    engine's last report shows it full: which one refused depends on when that report came)."""
    return (_metric(metrics, 'voxgate_admission_refused_total{reason="capacity"}')
            + _metric(metrics, "voxgate_admission_refused_at_gateway_total"))


async def _door_scenario(server: VoxgateServer) -> dict[str, Any]:
    async with VoxgateClient.connect(server.ws_url) as client:
        a = await client.start()
        await a.send_text(TEXT)  # no end yet: a holds the one place until it ends
        await _first_audio(a)
        # the engine's report that it is full (demand 1 of 1): from now on the gateway refuses
        await _until(lambda: _get(server.base_url + "health"), lambda t: json.loads(t).get("load") == 1.0)
        b = await client.start()
        await _speak(b)
        b_msgs = [msg async for msg in b.messages()]
        await a.end()
        await a.collect()
    metrics = await _until(lambda: _get(server.base_url + "metrics"), lambda t: _refused(t) == 1)
    return {"b": b_msgs, "metrics": metrics}


async def _queue_scenario(server: VoxgateServer) -> dict[str, Any]:
    async with VoxgateClient.connect(server.ws_url) as client:
        a = await client.start()
        await a.send_text(TEXT)  # no end yet: a holds the one place until it ends
        await _first_audio(a)
        health = json.loads(await _until(lambda: _get(server.base_url + "health"),
                                         lambda t: json.loads(t).get("load") == 1.0))
        b = await client.start()
        await _speak(b)
        await a.end()
        a_msgs = [msg async for msg in a.messages()]
        b_msgs = [msg async for msg in b.messages()]
    metrics = await _until(lambda: _get(server.base_url + "metrics"),
                           lambda t: "voxgate_admission_admitted_after_wait_total 1.0" in t)
    return {"a": a_msgs, "b": b_msgs, "health": health, "metrics": metrics}


def test_a_stream_past_capacity_is_refused_with_a_retry_hint(server_factory: Any) -> None:
    """Capacity 1, policy refuse: the second stream gets a retryable `capacity` error with
    retry_after_s and no audio; once the first is done a new stream speaks; /metrics counts
    the refusal."""
    server = server_factory("--model", "synthetic", "--admission", "refuse",
                            "--admission-initial-capacity", "1")
    out = asyncio.run(_refuse_scenario(server))
    [err] = out["b"]
    assert (err["type"], err["code"], err["retryable"]) == ("error", "capacity", True)
    assert err["retry_after_s"] > 0 and "retry after" in err["message"]
    assert out["a_done"]["reason"] == "end" and len(out["c_audio"]) > 0
    assert _refused(out["metrics"]) == 1
    assert "voxgate_admission_capacity_streams 1.0" in out["metrics"]


def test_once_the_engine_reports_it_is_full_the_gateway_refuses_without_it(server_factory: Any) -> None:
    """Capacity 1, policy refuse, the engine's report showing the one place taken: the second
    stream's `capacity` refusal (retryable, with its hint) comes from the gateway, so the
    engine never sees it (its own refusal counter stays at 0)."""
    server = server_factory("--model", "synthetic", "--admission", "refuse",
                            "--admission-initial-capacity", "1")
    out = asyncio.run(_door_scenario(server))
    [err] = out["b"]
    assert (err["type"], err["code"], err["retryable"]) == ("error", "capacity", True)
    assert err["retry_after_s"] > 0 and "no engine has room" in err["message"]
    failed = StreamFailed(err)  # what the client library raises: the hint to wait
    assert failed.code == "capacity" and failed.retryable and failed.retry_after_s == err["retry_after_s"]
    assert _metric(out["metrics"], "voxgate_admission_refused_at_gateway_total") == 1
    assert _metric(out["metrics"], 'voxgate_admission_refused_total{reason="capacity"}') == 0


def test_a_stream_past_capacity_waits_and_speaks_after_the_first(server_factory: Any) -> None:
    """Capacity 1, policy queue: /health says load 1.0 while the first speaks; the second gets
    no error, its first audio comes after the first stream's `done`, and its own `done` says
    how long it waited (part of its TTFA)."""
    server = server_factory("--model", "synthetic", "--admission", "queue",
                            "--admission-initial-capacity", "1", "--admission-max-wait-s", "30")
    out = asyncio.run(_queue_scenario(server))
    assert out["health"]["load"] == 1.0 and out["health"]["admission"]["capacity"] == 1
    a_done = out["a"][-1]
    b_audio = [msg for msg in out["b"] if msg["type"] == "audio"]
    b_done = out["b"][-1]
    assert a_done["type"] == b_done["type"] == "done" and b_done["reason"] == "end"
    assert b_audio and b_audio[0]["t_recv"] > a_done["t_recv"]
    assert b_done["queue_wait_ms"] > 0 and b_done["ttfa_ms"] >= b_done["queue_wait_ms"]
    assert "voxgate_admission_admitted_after_wait_total 1.0" in out["metrics"]
    assert "voxgate_admission_wait_seconds_count 1.0" in out["metrics"]
