"""Fuzzes the client frame decode path: hostile frames through a ``Session`` and a real engine core.

    python -m benchmark.fuzz_protocol --seconds 600

Runs Hypothesis for ``--seconds`` and prints the first failure, shrunk; what it sends and the
property ``check_frames`` asserts: benchmark/README.md. Needs the test extra (``hypothesis``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import messages as em
from engine.core import EngineCore
from engine.synthetic import SyntheticBackend
from gateway import protocol as p
from gateway.session import Action, Close, Session, ToClient, ToEngine

__all__ = ["DOCUMENTED_CLOSE_CODES", "InProcessEngine", "check_frames", "frame_sequences",
           "frames", "main"]

DOCUMENTED_ERRORS = frozenset(code.value for code in p.ErrorCode)
DOCUMENTED_CLOSE_CODES = frozenset({1000, 1001, 1008, 1009, 1011, 1013})
_LIMITS = {"max_streams_per_connection": 3, "max_text_chars_per_stream": 200,
           "max_frame_bytes": 1 << 20, "idle_timeout_s": 60}
_SURROGATES = ("\ud800", "\udbff", "\udc00", "\udfff", "\udc80")
_EDGE_INTS = (2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30, -(10**60))


class InProcessEngine:
    """``EngineCore`` over the synthetic backend, fed and read through message bytes."""

    def __init__(self) -> None:
        backend = SyntheticBackend(ms_per_char=2.0, chunk_ms=20.0, realtime=False, fail_mode="error")
        self.core = EngineCore(backend)
        info = backend.info
        self.hello = em.Hello(info.model, list(info.voices), info.default_voice, info.sample_rate,
                              dict(info.options))

    def handle(self, msg: em.Message) -> list[em.Message]:
        msg = em.decode(em.encode(msg))
        core = self.core
        if isinstance(msg, em.Open):
            return core.open(msg.key, msg.voice, msg.options, msg.format)
        if isinstance(msg, em.Text):
            return core.add_text(msg.key, msg.text)
        if isinstance(msg, em.Flush):
            return core.flush(msg.key)
        if isinstance(msg, em.End):
            return core.end(msg.key)
        if isinstance(msg, em.Cancel):
            return core.cancel(msg.key)
        raise AssertionError(f"the session sent the engine a {type(msg).__name__}")

    def step(self) -> list[em.Message]:
        return self.core.step() if self.core.has_work() else []


def _check(actions: list[Action]) -> list[em.Message]:
    """Assert the actions are well-formed; return the engine messages among them."""
    to_engine: list[em.Message] = []
    for action in actions:
        if isinstance(action, ToClient):
            msg = action.msg
            for encoding in p.Encoding:
                p.decode_server_frame(p.encode_server_message(msg, encoding))
            if msg["type"] == "error":
                assert msg["code"] in DOCUMENTED_ERRORS, msg
                assert isinstance(msg["retryable"], bool), msg
        elif isinstance(action, ToEngine):
            to_engine.append(action.msg)
        else:
            assert isinstance(action, Close) and action.code in DOCUMENTED_CLOSE_CODES, action
    return to_engine


def _pump(session: Session, engine: InProcessEngine, actions: list[Action]) -> None:
    """Carry actions out as the server does, and the engine's answers back to the session."""
    pending = _check(actions)
    while pending:
        out: list[em.Message] = []
        for msg in pending:
            out.extend(engine.handle(msg))
        pending = _deliver(session, out)


def _deliver(session: Session, out: list[em.Message]) -> list[em.Message]:
    """Engine output to the session (through bytes); the engine messages it answers with."""
    pending: list[em.Message] = []
    for msg in out:
        msg = em.decode(em.encode(msg))
        if type(msg) is em.Audio and msg.key % 2:  # both routes the server uses for audio
            frame = session.on_audio(msg)
            if frame is not None:
                _check([ToClient(frame)])
        else:
            pending.extend(_check(session.on_engine(msg)))
    return pending


def check_frames(frames: list[bytes | str]) -> None:
    """Feed ``frames`` to one connection's session (an engine step after each); then close it."""
    engine = InProcessEngine()
    keys = itertools.count(1)
    session = Session(hello=engine.hello, limits=_LIMITS, allocate_key=lambda: next(keys),
                      is_engine_ready=lambda: True)
    _check([ToClient(session.greeting())])
    for frame in frames:
        _pump(session, engine, session.receive_frame(frame))
        _pump(session, engine, [ToEngine(m) for m in _deliver(session, engine.step())])
    _pump(session, engine, session.close())
    assert engine.core.num_streams == 0, "a stream outlived its connection in the engine"


# --- strategies ------------------------------------------------------------------------------

_surrogate_text = st.builds(lambda a, s, b: a + s + b, st.text(max_size=4),
                            st.sampled_from(_SURROGATES), st.text(max_size=4))
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from(_EDGE_INTS),
    st.integers(min_value=-(2**80), max_value=2**80), st.floats(), st.text(max_size=12),
    _surrogate_text, st.binary(max_size=12),
)
hostile_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=4) | _surrogate_text, inner, max_size=3),
    max_leaves=8)
_deep = st.integers(min_value=600, max_value=6000)


def _either(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(valid, valid, hostile_values)


_stream_ids = _either(st.sampled_from(["a", "b", "c", 7, "x" * 129, ""]))
_options = st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(["speed", "seed", "temperature"]), _surrogate_text,
                              st.text(max_size=4), st.integers(), st.none()),
                    _either(st.one_of(st.floats(0.5, 2.0), st.integers(0, 2**63 - 1))), max_size=3),
    hostile_values)
_FIELDS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "start": {"voice": _either(st.sampled_from(["tone", "noise", "nope"])),
              "format": _either(st.sampled_from(p.FORMATS)), "options": _options,
              "sample_rate": _either(st.sampled_from(p.OUTPUT_SAMPLE_RATES))},
    "text": {"text": _either(st.text(max_size=60))},
    "flush": {}, "end": {}, "cancel": {},
}


def _client_map(kind: str) -> st.SearchStrategy[dict[Any, Any]]:
    return st.fixed_dictionaries(
        {"type": _either(st.just(kind)), "stream": _stream_ids},
        optional={**_FIELDS[kind], "extra": hostile_values})


def _encode(value: Any, as_json: bool) -> bytes | str:
    """The frame a client could send; values msgpack cannot carry (past 64 bits) go as JSON."""
    if not as_json:
        try:
            return msgpack.Packer(use_bin_type=True, unicode_errors="surrogatepass").pack(value)
        except (OverflowError, ValueError, TypeError):
            pass
    try:
        return json.dumps(value, default=lambda o: o.hex() if isinstance(o, bytes) else str(o))
    except (ValueError, RecursionError):  # the client's own encoder refuses: any text will do
        return f"not JSON: a {type(value).__name__}"


frames = st.one_of(
    st.builds(_encode, st.one_of(*(_client_map(kind) for kind in _FIELDS)), st.booleans()),
    st.builds(_encode, hostile_values, st.booleans()),
    st.binary(max_size=64),
    st.text(max_size=64),
    _deep.map(lambda n: "[" * n + "]" * n),
    _deep.map(lambda n: '{"type": "start", "stream": "a", "options": {"x": ' + '{"a": ' * n + "1" + "}" * n + "}}"),
    _deep.map(lambda n: b"\x91" * n + b"\xc0"),
)
frame_sequences = st.lists(frames, max_size=8)


# --- the long run ----------------------------------------------------------------------------


def _round(max_examples: int) -> None:
    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(frame_sequences)
    def run(seq: list[bytes | str]) -> None:
        check_frames(seq)

    run()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.fuzz_protocol",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="how long to fuzz, in rounds of --round-examples (default 60)")
    ap.add_argument("--round-examples", type=int, default=500,
                    help="examples per Hypothesis round (default 500)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    rounds = 0
    while rounds == 0 or time.monotonic() - t0 < args.seconds:
        try:
            _round(args.round_examples)
        except Exception as exc:  # Hypothesis re-raises the shrunk failure after printing it
            print(f"fuzz_protocol: FAILED after {rounds} rounds: {type(exc).__name__}: {exc}")
            return 1
        rounds += 1
    print(f"fuzz_protocol: {rounds} rounds of {args.round_examples} examples "
          f"({rounds * args.round_examples} frame sequences) in {time.monotonic() - t0:.0f} s: no failure")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
