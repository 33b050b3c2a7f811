"""engine.messages: every gateway <-> engine message survives encode/decode unchanged."""

from __future__ import annotations

import pytest

from engine import messages as m

EXAMPLES: list[m.Message] = [
    m.Open(7, "heart", {"seed": 3, "temperature": 0.5}),
    m.Open(8, None, {}, "pcm_s16le"),
    m.Open(9, None, {}, "pcm_s16le", m.VoiceRef("v-1", "/data/voices/v-1.wav", 44100, "ab" * 32,
                                                 "Hello, this is my voice.")),
    m.Open(10, None, {}, "pcm_f32le", m.VoiceRef("v-2", "/data/v-2.wav", 16000, "cd" * 32)),
    m.Text(7, "héllo, wörld ✓"),
    m.Flush(7),
    m.End(7),
    m.Cancel(7),
    m.Shutdown(),
    m.Hello("hibari", ["heart"], "heart", 24000, {"speed": {"min": 0.5, "max": 2.0}}),
    m.Hello("orpheus", ["tara"], "tara", 24000, {}, "NVIDIA H200, 140 GiB, GPU-1234, torch 2.11.0, CUDA 13.0"),
    m.Hello("qwen3-tts", ["vivian"], "vivian", 24000, {}, "cpu", "random", supports_cloning=True),
    m.Started(7, "heart", {"speed": 1.0}),
    m.Audio(7, b"\x00\x01" * 100, (0, 12), 123.5),
    m.Audio(7, b"", None, 0.0),
    m.Done(7, "end", 4800, {"ttfa_ms": 12.5}),
    m.Error(7, "model_error", "boom", True),
    m.Error(None, "load_failed", "no weights", False),
    m.Stats(3, 1, 2),
    m.Error(9, "capacity", "server at capacity; retry after 1.5 s", True, 1.5),
    m.Stats(3, 1, 2, {"steps": 10}, {"policy": "queue", "capacity": 480, "demand": 12,
                                     "queued": 0, "waits_s": [0.25]}),
    m.Batch([m.Audio(7, b"\x00\x01" * 4, (0, 12), 1.5), m.Done(7, "end", 4, {}),
             m.Error(8, "model_error", "boom", True)]),
    m.Batch([]),
    m.Heartbeat(0.0, 0),
    m.Heartbeat(12.5, 4096),
    m.Flushed(7, 3),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda x: type(x).__name__)
def test_round_trip(msg: m.Message) -> None:
    """decode(encode(msg)) == msg for every message type."""
    assert m.decode(m.encode(msg)) == msg


def test_every_kind_has_an_example() -> None:
    """The examples above cover every Kind."""
    assert {type(x).KIND for x in EXAMPLES} == set(m.Kind)


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01\x02\x03", b"\x92\x63\x01", b"\x91\xa1x"])
def test_malformed_bytes_raise_decode_error(data: bytes) -> None:
    """Garbage, unknown kinds and wrong field counts raise DecodeError, never anything else."""
    with pytest.raises(m.DecodeError):
        m.decode(data)


def test_batch_cannot_nest() -> None:
    """A Batch inside a Batch is refused when encoding and when decoding."""
    with pytest.raises(ValueError):
        m.encode(m.Batch([m.Batch([])]))
    nested = b"\x92\x1a\x91\x92\x1a\x90"  # [26, [[26, []]]]
    with pytest.raises(m.DecodeError):
        m.decode(nested)


def test_malformed_batch_raises_decode_error() -> None:
    """A Batch whose body is not a list, or holds a bad message, raises DecodeError."""
    for data in (b"\x92\x1a\x01", b"\x92\x1a\x91\x91\x63"):
        with pytest.raises(m.DecodeError):
            m.decode(data)


@pytest.mark.parametrize("voice_ref", [["v-1"], ["v-1", "/p.wav", "44100", "ab", None],
                                       ["v-1", "/p.wav", 44100, "ab", 7], "v-1"])
def test_malformed_voice_ref_raises_decode_error(voice_ref: object) -> None:
    """An Open whose voice_ref has the wrong shape or field types raises DecodeError."""
    import msgpack

    data = msgpack.packb([int(m.Kind.OPEN), 1, None, {}, "pcm_s16le", voice_ref])
    with pytest.raises(m.DecodeError):
        m.decode(data)
