"""The native protocol under Hypothesis against the real server with the embedded voice: hostile
frames on ``/v1/stream`` (``benchmark.fuzz_protocol``'s, in JSON and msgpack, with the voice's
own texts) go through the gateway and the engine process; a stream opened after them still
speaks to its end, every error is a documented one, the engine never restarts and nothing is
logged as an exception."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from benchmark.fuzz_protocol import DOCUMENTED_CLOSE_CODES, DOCUMENTED_ERRORS
from benchmark.fuzz_protocol import frames as hostile_frames
from tests.conftest import VoxgateServer, assert_no_exception_logged, start_server

pytestmark = pytest.mark.slow

_SETTINGS = settings(max_examples=80, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.function_scoped_fixture])
_TIMEOUT_S = 30.0  # a failure guard: the last stream's done comes long before


@pytest.fixture(scope="module")
def server() -> Iterator[VoxgateServer]:
    """A server of its own, so that its whole log can be read once it has stopped."""
    server = start_server()
    yield server
    with urllib.request.urlopen(server.base_url + "health", timeout=10) as response:
        engine = json.loads(response.read())["engine"]
    server.stop()
    assert engine["restarts"] == 0, engine
    assert_no_exception_logged(server)


def _message(kind: str, text: str, voice: Any) -> dict[str, Any]:
    msg: dict[str, Any] = {"type": kind, "stream": "a"}
    if kind == "start" and voice is not None:
        msg["voice"] = voice
    if kind == "text":
        msg["text"] = text
    return msg


# what reaches the voice: texts of any characters (scripts it cannot read, digits it reads
# its own way, lone surrogates' neighbours) in streams that open and end properly
_spoken = st.builds(lambda kind, text, voice, binary: _encode(_message(kind, text, voice), binary),
                    st.sampled_from(["start", "text", "text", "flush", "end", "cancel"]),
                    st.text(max_size=40), st.sampled_from([None, "heart", "nope"]), st.booleans())


def _encode(msg: dict[str, Any], binary: bool) -> bytes | str:
    return msgpack.packb(msg, use_bin_type=True) if binary else json.dumps(msg)


def _decode(raw: bytes | str) -> Any:
    return json.loads(raw) if isinstance(raw, str) else msgpack.unpackb(raw, raw=False)


@_SETTINGS
@given(frames=st.lists(st.one_of(_spoken, _spoken, hostile_frames), max_size=8))
def test_any_frames_leave_the_connection_and_the_engine_speaking(server: VoxgateServer,
                                                                  frames: list[bytes | str]) -> None:
    """Any frames, then a stream of its own: errors are documented codes, and that stream's
    audio comes and its ``done`` (or a documented close, if one of the frames was too large)."""
    last = [json.dumps({"type": "start", "stream": "zz-last"}),
            json.dumps({"type": "text", "stream": "zz-last", "text": "Hello there."}),
            json.dumps({"type": "end", "stream": "zz-last"})]
    with connect(server.ws_url, max_size=None, open_timeout=_TIMEOUT_S) as ws:
        try:
            for frame in [*frames, *last]:
                ws.send(frame)
            while True:
                msg = _decode(ws.recv(timeout=_TIMEOUT_S))
                if not isinstance(msg, dict):
                    continue
                if msg.get("type") == "error":
                    assert msg.get("code") in DOCUMENTED_ERRORS, msg
                if msg.get("stream") == "zz-last" and msg.get("type") in ("done", "error"):
                    if msg["type"] == "error":  # the connection's stream limit, say: documented
                        assert msg["code"] in DOCUMENTED_ERRORS, msg
                    break
        except ConnectionClosed:
            assert ws.close_code in DOCUMENTED_CLOSE_CODES and ws.close_code != 1011, (
                ws.close_code, ws.close_reason)
