"""gateway.compat.base: vendor voice names, speed options, JSON frames."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gateway.compat.base import CompatError, VoiceNames, load_json, speech_options


def _gateway(*, voice_map: tuple[str, ...] = (), unknown: str = "default",
             registered: dict[str, Any] | None = None) -> Any:
    store = SimpleNamespace(resolve=lambda name: (registered or {}).get(name))
    hello = SimpleNamespace(voices=("heart", "bella"),
                            options={"speed": {"min": 0.5, "max": 2.0, "default": 1.0}})
    return SimpleNamespace(
        config=SimpleNamespace(compat_voice_map=voice_map, compat_unknown_voice=unknown),
        engine=SimpleNamespace(hello=hello), voices=store)


def test_vendor_voice_names_map_to_served_voices() -> None:
    """Mapped names first, then served and registered names as they are; any other is the default voice (None)."""
    names = VoiceNames(_gateway(voice_map=("alloy=bella",), registered={"Alice": object()}))
    assert names.resolve("alloy", field="voice") == "bella"
    assert names.resolve("heart", field="voice") == "heart"
    assert names.resolve("Alice", field="voice") == "Alice"
    assert names.resolve("21m00Tcm4TlvDq8ikWAM", field="voice_id") is None
    assert names.resolve(None, field="voice") is None and names.resolve("", field="voice") is None


def test_unknown_voice_refused_when_configured() -> None:
    """--compat-unknown-voice refuse: an unknown name is unknown_voice naming the field and the served voices; a non-string is bad_message."""
    names = VoiceNames(_gateway(unknown="refuse"))
    with pytest.raises(CompatError) as info:
        names.resolve("nova", field="voice")
    assert info.value.code == "unknown_voice" and info.value.field == "voice"
    assert "heart" in info.value.message and "--compat-voice-map" in info.value.message
    with pytest.raises(CompatError) as info:
        names.resolve(5, field="voice")
    assert info.value.code == "bad_message"


def test_speed_becomes_the_declared_option_clipped_to_its_range() -> None:
    """A vendor speed is the model's speed option, clipped to the declared range; strings of numbers pass; out of [0.25, 4] is refused."""
    gw = _gateway()
    assert speech_options(gw, speed=None) == {}
    assert speech_options(gw, speed=1.25) == {"speed": 1.25}
    assert speech_options(gw, speed="3.0") == {"speed": 2.0}
    assert speech_options(gw, speed=0.3) == {"speed": 0.5}
    for bad in (9, "fast", True):
        with pytest.raises(CompatError):
            speech_options(gw, speed=bad)
    gw.engine.hello.options = {}
    assert speech_options(gw, speed=1.5) == {}  # a model without speed: accepted, no effect


def test_load_json_refuses_what_is_not_an_object() -> None:
    """Invalid JSON, arrays and deep nesting are bad_message, never an exception of another kind."""
    assert load_json('{"type": "Speak"}') == {"type": "Speak"}
    for frame in ("not json", "[1, 2]", "[" * 100000, b"\xff\xfe"):
        with pytest.raises(CompatError) as info:
            load_json(frame)
        assert info.value.code == "bad_message"


class _Pieces:
    """A request body that arrives in pieces: each ``read(n)`` gives at most what has come."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = list(pieces)
        self.reads: list[int] = []

    async def read(self, n: int) -> bytes:
        self.reads.append(n)
        if not self.pieces:
            return b""
        piece = self.pieces.pop(0)
        if len(piece) > n:
            piece, rest = piece[:n], piece[n:]
            self.pieces.insert(0, rest)
        return piece


class _Request:
    def __init__(self, pieces: list[bytes]) -> None:
        self.content = _Pieces(pieces)


def test_read_body_waits_for_every_piece_of_a_large_body_and_stops_past_the_limit() -> None:
    """A 60 kB JSON body that arrives in three pieces is read whole (one read returned only its
    first piece: the OpenAI test's 400 "not valid JSON" under load); past the limit reading stops
    at limit + 1 bytes."""
    import asyncio
    import json

    from gateway.compat.base import read_body

    body = json.dumps({"input": "x" * 60000}).encode()
    pieces = [body[:16384], body[16384:40000], body[40000:]]
    got = asyncio.run(read_body(_Request(pieces), 1 << 20))
    assert got == body
    big = _Request([b"a" * 100, b"b" * 100, b"c" * 100])
    assert asyncio.run(read_body(big, 150)) == b"a" * 100 + b"b" * 51
    assert big.content.reads == [151, 51]
    assert asyncio.run(read_body(_Request([]), 10)) == b""
