"""gateway.protocol: every client and server message round-trips in msgpack and JSON."""

from __future__ import annotations

import pytest

from gateway import protocol as p

CLIENT = [
    {"type": "start", "stream": "a", "voice": "heart", "format": "pcm_f32le",
     "options": {"seed": 1, "temperature": 0.7}},
    {"type": "text", "stream": "a", "text": "Hé, 3.14 ✓"},
    {"type": "flush", "stream": "a"},
    {"type": "end", "stream": "a"},
    {"type": "cancel", "stream": "a"},
]
EXPECTED = [
    p.Start("a", "heart", "pcm_f32le", {"seed": 1, "temperature": 0.7}),
    p.TextIn("a", "Hé, 3.14 ✓"),
    p.Flush("a"),
    p.End("a"),
    p.Cancel("a"),
]

SERVER = [
    p.hello(model="m", voices=["v"], sample_rate=24000, default_voice="v", options={},
            limits={"max_frame_bytes": 10}),
    p.ready("a", sample_rate=24000, fmt="pcm_s16le", voice="v", options={"seed": 0}),
    p.audio("a", seq=3, offset=480, pcm=b"\x00\x01\xff", span=(0, 4), text="Hé, "),
    p.done("a", reason="end", samples=480, ttfa_ms=12.5),
    p.error(p.ErrorCode.CAPACITY, "full", stream="a", retryable=True),
    p.error("bad_message", "oops"),
]


@pytest.mark.parametrize("encoding", list(p.Encoding))
@pytest.mark.parametrize("msg,expected", list(zip(CLIENT, EXPECTED)), ids=[m["type"] for m in CLIENT])
def test_client_messages_round_trip(msg: dict, expected: p.ClientMessage, encoding: p.Encoding) -> None:
    """encode_client_message then parse_client_frame gives the typed message."""
    assert p.parse_client_frame(p.encode_client_message(msg, encoding)) == expected


@pytest.mark.parametrize("encoding", list(p.Encoding))
@pytest.mark.parametrize("msg", SERVER, ids=[m["type"] for m in SERVER])
def test_server_messages_round_trip(msg: dict, encoding: p.Encoding) -> None:
    """encode_server_message then decode_server_frame gives the same map (PCM as bytes)."""
    assert p.decode_server_frame(p.encode_server_message(msg, encoding)) == msg


def test_integer_stream_ids_are_accepted_as_strings() -> None:
    """A numeric stream id is taken as its decimal string."""
    assert p.parse_client_frame('{"type": "end", "stream": 7}') == p.End("7")


@pytest.mark.parametrize("options", ['{"t": NaN}', '[1]', '{"1": 2, "x": Infinity}'])
def test_bad_options_rejected(options: str) -> None:
    """Non-map options or non-finite numbers are refused with a clear code."""
    with pytest.raises(p.ProtocolError) as info:
        p.parse_client_frame('{"type": "start", "stream": "a", "options": %s}' % options)
    assert info.value.code in (p.ErrorCode.BAD_MESSAGE, p.ErrorCode.INVALID_OPTION)


def test_start_takes_an_integer_sample_rate() -> None:
    """start's sample_rate is parsed as an int; without it the Start has None (the model's rate)."""
    frame = p.encode_client_message({"type": "start", "stream": "a", "sample_rate": 16000})
    assert p.parse_client_frame(frame) == p.Start("a", sample_rate=16000)
    assert p.parse_client_frame('{"type": "start", "stream": "a"}').sample_rate is None


@pytest.mark.parametrize("value", ['"16000"', "16000.0", "true", "[16000]", "{}"])
def test_a_sample_rate_that_is_not_an_integer_is_an_unsupported_format(value: str) -> None:
    """A string, float, boolean, list or map sample_rate is refused naming the rates."""
    with pytest.raises(p.ProtocolError) as info:
        p.parse_client_frame('{"type": "start", "stream": "a", "sample_rate": %s}' % value)
    assert info.value.code is p.ErrorCode.UNSUPPORTED_FORMAT and info.value.stream == "a"
    assert str(list(p.OUTPUT_SAMPLE_RATES)) in info.value.message


def test_output_rates_are_the_set_and_the_models_rate() -> None:
    """hello's output_sample_rates: the documented set plus the model's own rate, sorted;
    check_sample_rate takes one of them (None: the model's rate) and refuses the rest."""
    assert p.output_sample_rates(24000) == list(p.OUTPUT_SAMPLE_RATES)
    assert p.output_sample_rates(12000) == sorted([*p.OUTPUT_SAMPLE_RATES, 12000])
    msg = p.hello(model="m", voices=["v"], sample_rate=12000, default_voice="v", options={},
                  limits={})
    assert msg["output_sample_rates"] == p.output_sample_rates(12000)
    assert p.check_sample_rate(None, 12000, stream="a") == 12000
    assert p.check_sample_rate(12000, 12000, stream="a") == 12000
    assert p.check_sample_rate(44100, 12000, stream="a") == 44100
    with pytest.raises(p.ProtocolError) as info:
        p.check_sample_rate(11025, 24000, stream="a")
    assert info.value.code is p.ErrorCode.UNSUPPORTED_FORMAT and "11025" in info.value.message
