"""web_demo/msgpack.js against the Python msgpack package: same bytes both ways, same values."""

from __future__ import annotations

import json
import math
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgpack
import pytest

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "web_demo" / "msgpack.js"
HARNESS = Path(__file__).with_name("msgpack_harness.mjs")



def _node() -> str | None:
    """A node binary: the system's, else the one bundled inside the playwright package."""
    found = shutil.which("node")
    if found:
        return found
    try:
        import playwright
    except ImportError:
        return None
    bundled = Path(playwright.__file__).parent / "driver" / "node"
    return str(bundled) if bundled.is_file() else None


NODE = _node()
pytestmark = pytest.mark.skipif(NODE is None, reason="needs node (or pip install playwright, which bundles one)")


def _tag(v: Any) -> Any:
    """Python value -> tagged JSON (see msgpack_harness.mjs)."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v if abs(v) <= 2**53 - 1 else {"$int": str(v)}
    if isinstance(v, float):
        if math.isnan(v):
            return {"$float": "nan"}
        if math.isinf(v):
            return {"$float": "inf" if v > 0 else "-inf"}
        return {"$float": repr(v)}
    if isinstance(v, (bytes, bytearray)):
        return {"$bin": bytes(v).hex()}
    if isinstance(v, (list, tuple)):
        return [_tag(x) for x in v]
    if isinstance(v, dict):
        return {"$map": [[_tag(k), _tag(x)] for k, x in v.items()]}
    raise TypeError(type(v))


def _untag(t: Any) -> Any:
    if t is None or isinstance(t, (bool, int, str)):
        return t
    if isinstance(t, list):
        return [_untag(x) for x in t]
    if "$bin" in t:
        return bytes.fromhex(t["$bin"])
    if "$int" in t:
        return int(t["$int"])
    if "$float" in t:
        return float(t["$float"])
    if "$map" in t:
        return {_hashable(_untag(k)): _untag(x) for k, x in t["$map"]}
    raise ValueError(t)


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _same(a: Any, b: Any) -> bool:
    """Equality that treats NaN as equal to NaN and tells -0.0 from 0.0."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _boundary_corpus() -> list[Any]:
    ints = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**53 - 1, 2**53, 2**53 + 1,
            2**63, 2**64 - 1, -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1,
            -(2**53) + 1, -(2**53) - 1, -(2**63)]
    floats = [0.5, -0.5, 0.1, 1e300, -2.5e-308, 5e-324, 3.141592653589793, -0.0,
              float("inf"), float("-inf"), float("nan")]
    strs = ["", "a", "x" * 31, "x" * 32, "y" * 255, "y" * 256, "z" * 65535, "z" * 65536,
            "héllo wörld", "日本語のテキスト", "emoji 🙂🚀 pairs", "\x00nul\x7f"]
    bins = [b"", b"\x00", bytes(range(256)), b"\xff" * 255, b"\x01" * 256, b"\x02" * 65536]
    arrays = [[], list(range(15)), list(range(16)), list(range(65536)), [[[]]], [None, True, False]]
    maps = [{}, {f"k{i}": i for i in range(15)}, {f"k{i}": i for i in range(16)},
            {f"key{i}": i for i in range(65536)}, {"nested": {"a": [1, {"b": b"\x00"}]}},
            {"type": "audio", "stream": "turn-1", "seq": 3, "offset": 7200, "pcm": b"\x01\x00" * 2400,
             "span": [0, 5], "text": "Hello,"}]
    return [None, True, False, *ints, *floats, *strs, *bins, *arrays, *maps]


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["nil", "bool", "int", "bigint", "float", "str", "bin"]
    if depth < 4:
        kinds += ["array", "map"] * 2
    kind = rng.choice(kinds)
    if kind == "nil":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rng.randint(-(2**31), 2**32)
    if kind == "bigint":
        return rng.choice([rng.randint(-(2**63), -(2**31)), rng.randint(2**32, 2**64 - 1)])
    if kind == "float":
        x = rng.uniform(-1e6, 1e6) * 10.0 ** rng.randint(-30, 30)
        # An integral float below 2**53 decodes to a JS int (documented); keep those out.
        while x == int(x) and abs(x) < 2**53:
            x = rng.uniform(-1e6, 1e6)
        return x
    if kind == "str":
        return "".join(rng.choice("abc xyz-é中🙂\n") for _ in range(rng.randint(0, 40)))
    if kind == "bin":
        return rng.randbytes(rng.randint(0, 300))
    if kind == "array":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 20))]
    return {f"k{rng.randint(0, 10**6)}": _random_value(rng, depth + 1) for _ in range(rng.randint(0, 20))}


def _run_harness(values: list[Any], tmp_path: Path, malformed: list[bytes] = ()) -> dict[str, Any]:
    module = tmp_path / "msgpack.mjs"
    shutil.copyfile(MODULE, module)
    payload = {
        "packed": [msgpack.packb(v, use_bin_type=True).hex() for v in values],
        "values": [_tag(v) for v in values],
        "malformed": [m.hex() for m in malformed],
    }
    proc = subprocess.run(
        [str(NODE), str(HARNESS), str(module)], input=json.dumps(payload), capture_output=True,
        text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def corpus() -> list[Any]:
    rng = random.Random(1234)
    return _boundary_corpus() + [_random_value(rng) for _ in range(400)]


@pytest.fixture(scope="module")
def harness_out(corpus: list[Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    malformed = [b"", b"\xc1", b"\xd9\x05ab", b"\x92\x01", b"\x01\x02", b"\xc7\x01\x05\x00",
                 b"\xa2\xff\xfe", b"\xdc\xff"]
    return _run_harness(corpus, tmp_path_factory.mktemp("msgpack"), malformed)


def test_python_bytes_reencode_identically_in_js(corpus: list[Any], harness_out: dict[str, Any]) -> None:
    """Python-packed bytes decoded and re-encoded by msgpack.js give back the same bytes."""
    for value, out_map, out_obj in zip(corpus, harness_out["reencodedMap"], harness_out["reencodedObject"]):
        expected = msgpack.packb(value, use_bin_type=True).hex()
        assert out_map == expected, value if len(repr(value)) < 300 else type(value)
        assert out_obj == expected, value if len(repr(value)) < 300 else type(value)


def test_js_encoding_matches_python_bytes(corpus: list[Any], harness_out: dict[str, Any]) -> None:
    """The same value encoded by msgpack.js and by Python msgpack gives the same bytes."""
    for value, got in zip(corpus, harness_out["encoded"]):
        assert got == msgpack.packb(value, use_bin_type=True).hex(), repr(value)[:300]


def test_js_decodes_python_values(corpus: list[Any], harness_out: dict[str, Any]) -> None:
    """msgpack.js decodes every Python-packed value to an equal value (ints as Number or BigInt)."""
    for value, got in zip(corpus, harness_out["decoded"]):
        decoded = _untag(got)
        assert _same(decoded, msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False)), repr(value)[:300]


def test_js_bytes_decode_in_python(corpus: list[Any], harness_out: dict[str, Any]) -> None:
    """Bytes produced by msgpack.js unpack in Python to the original value."""
    for value, got in zip(corpus, harness_out["encoded"]):
        assert _same(msgpack.unpackb(bytes.fromhex(got), raw=False), value), repr(value)[:300]


def test_malformed_input_throws(harness_out: dict[str, Any]) -> None:
    """Truncated input, reserved bytes, ext types, bad UTF-8 and trailing bytes raise errors."""
    for result in harness_out["malformed"]:
        assert isinstance(result, dict) and "error" in result, result


def test_integral_float_decodes_to_equal_number(tmp_path: Path) -> None:
    """A float with an integral value (2.0) round-trips to an equal value, encoded as an int."""
    out = _run_harness([2.0, -7.0, 1e20], tmp_path)
    for value, got in zip([2.0, -7.0, 1e20], out["reencodedMap"]):
        assert msgpack.unpackb(bytes.fromhex(got)) == value
