"""Codec parity with qwen-tts: whole-sequence decode, prefix, stateful streaming, several slots;
the streaming tests for both step layouts (channels-first ``CodecStream``, channels-last
``CodecStreamNWC``)."""

from __future__ import annotations

import pytest
import torch
from tests.models.qwen3_tts.qwen3_fixtures import JOBS, load_ours

from models.qwen3_tts.codec_nwc import make_codec_stream

# (layout, the dense convolutions' kind): the channels-first step, the channels-last one with
# GEMMs of gathered taps, and with cuDNN's channels-last convolution
STEPS = [("ncw", None), ("nwc", "gemm"), ("nwc", "cudnn")]

REL = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _codes() -> torch.Tensor:
    return torch.tensor(JOBS["codec"]["codes"], dtype=torch.int64)  # [T, G]


def test_reference_codec_is_not_silent(reference):
    """The tiny codec makes audible output, so the comparisons below are not vacuous."""
    assert float(reference["codec"]["whole"].abs().max()) > 1e-2
    assert float(reference["codec"]["whole"].std()) > 1e-3


def test_whole_decode_equals_reference_forward(ckpt_root, reference):
    """Codec.forward equals the reference decoder's plain forward within 1e-5 relative."""
    codec = load_ours(ckpt_root, "custom").codec
    with torch.no_grad():
        ours = codec(_codes()[None])[0]
    ref = reference["codec"]["whole"]
    assert ours.shape == ref.shape == (30 * 1920,)
    assert _rel(ours, ref) < REL


def test_prefix_decode_is_a_prefix_of_the_whole(reference):
    """The reference decoder is causal: decoding a prefix gives the whole decode's prefix."""
    ref = reference["codec"]
    n = JOBS["codec"]["prefix"] * 1920
    assert _rel(ref["prefix"], ref["whole"][:n]) < REL


@pytest.mark.parametrize(("layout", "conv"), STEPS)
def test_streaming_equals_reference_whole_decode(ckpt_root, reference, layout, conv):
    """Frame-by-frame streamed output concatenated equals the reference's whole decode
    (the window of 8 frames is crossed: 30 frames)."""
    codec = load_ours(ckpt_root, "custom").codec
    stream = make_codec_stream(codec, 2, layout=layout, conv=conv)
    slots = torch.tensor([1])
    stream.reset(slots)
    codes = _codes()
    with torch.no_grad():
        pcm = torch.cat([stream.step(slots, codes[t:t + 1])[0] for t in range(len(codes))])
    assert stream.delay_samples == 0
    assert _rel(pcm, reference["codec"]["whole"]) < REL


@pytest.mark.parametrize(("layout", "conv"), STEPS)
def test_slots_at_different_positions_equal_each_alone(ckpt_root, layout, conv):
    """Three slots joining at different frames, batched with a padding row on the scratch slot,
    each equal their own solo stream; reset restarts a slot."""
    codec = load_ours(ckpt_root, "custom").codec
    g = torch.Generator().manual_seed(9)
    seqs = [torch.randint(0, 2048, (n, 16), generator=g) for n in (20, 14, 9)]
    starts = [0, 6, 11]
    with torch.no_grad():
        solo = [codec(s[None])[0] for s in seqs]
        stream = make_codec_stream(codec, 4, layout=layout, conv=conv)
        out = {i: [] for i in range(3)}
        slot_of = {0: 3, 1: 0, 2: 2}
        stream.reset(torch.tensor([1]))  # slot 1 is used by nobody; resets are idempotent
        for t in range(20):
            rows = [i for i in range(3) if starts[i] <= t < starts[i] + len(seqs[i])]
            for i in rows:
                if t == starts[i]:
                    stream.reset(torch.tensor([slot_of[i]]))
            slots = torch.tensor([slot_of[i] for i in rows] + [stream.scratch_slot])
            codes = torch.stack([seqs[i][t - starts[i]] for i in rows] + [torch.zeros(16, dtype=torch.int64)])
            pcm = stream.step(slots, codes)
            for j, i in enumerate(rows):
                out[i].append(pcm[j])
    for i in range(3):
        assert _rel(torch.cat(out[i]), solo[i]) < REL, i


@pytest.mark.parametrize(("layout", "conv"), STEPS)
def test_reset_slot_decodes_afresh(ckpt_root, layout, conv):
    """After reset a slot's stream equals a fresh decode (no state leaks across turns)."""
    codec = load_ours(ckpt_root, "custom").codec
    codes = _codes()
    stream = make_codec_stream(codec, 1, layout=layout, conv=conv)
    slots = torch.tensor([0])
    with torch.no_grad():
        for t in range(12):
            stream.step(slots, codes[t:t + 1])
        stream.reset(slots)
        again = torch.cat([stream.step(slots, codes[t:t + 1])[0] for t in range(10)])
        whole = codec(codes[None, :10])[0]
    assert _rel(again, whole) < REL


def test_the_compiled_snake_gives_the_eager_audio(ckpt_root):
    """``compile=True`` (SnakeBeta through torch.compile; traced here with the aot_eager backend,
    the same graph without code generation) streams the audio of the eager channels-last step."""
    codec = load_ours(ckpt_root, "custom").codec
    codes = _codes()
    slots = torch.tensor([0])
    with torch.no_grad():
        eager = make_codec_stream(codec, 1, layout="nwc")
        compiled = make_codec_stream(codec, 1, layout="nwc", compile=True, compile_backend="aot_eager")
        a = torch.cat([eager.step(slots, codes[t:t + 1])[0] for t in range(8)])
        b = torch.cat([compiled.step(slots, codes[t:t + 1])[0] for t in range(8)])
    assert _rel(b, a) < REL


def test_an_unknown_layout_is_refused_naming_the_layouts(ckpt_root):
    codec = load_ours(ckpt_root, "custom").codec
    with pytest.raises(ValueError, match="ncw, nwc"):
        make_codec_stream(codec, 1, layout="nhwc")
    with pytest.raises(ValueError, match="gemm, cudnn"):
        make_codec_stream(codec, 1, layout="nwc", conv="winograd")
    with pytest.raises(ValueError, match="need codec_layout=nwc"):
        make_codec_stream(codec, 1, conv="cudnn")


def test_a_snake_that_cannot_compile_fails_at_load_or_runs_unfused(ckpt_root, caplog):
    """Where ``torch.compile`` fails (no Triton or C compiler on the machine, simulated by a
    backend that raises), a compile asked for fails when the codec is built, not at the first
    frame; the default's compile (``compile_fallback``) logs why and runs SnakeBeta unfused, with
    the same audio as the eager step."""
    from models.qwen3_tts import codec_nwc

    def broken_backend(gm, example_inputs):  # noqa: ANN001, ANN202 - a torch.compile backend
        raise RuntimeError("no C compiler found")

    codec = load_ours(ckpt_root, "custom").codec
    with pytest.raises(Exception, match="no C compiler found"):
        make_codec_stream(codec, 2, layout="nwc", compile=True, compile_backend=broken_backend)
    torch._dynamo.reset()
    with caplog.at_level("WARNING", logger=codec_nwc.__name__):
        fallen = make_codec_stream(codec, 2, layout="nwc", compile=True, compile_backend=broken_backend,
                                   compile_fallback=True)
    assert fallen._last_snake.fn is codec_nwc.snake
    assert "did not compile here" in caplog.text and "no C compiler found" in caplog.text
    eager = make_codec_stream(codec, 2, layout="nwc")
    codes = _codes()[:4]
    slots = torch.tensor([0])
    with torch.no_grad():
        a = torch.cat([eager.step(slots, codes[t:t + 1])[0] for t in range(4)])
        b = torch.cat([fallen.step(slots, codes[t:t + 1])[0] for t in range(4)])
    assert torch.equal(a, b) and float(a.abs().max()) > 1e-3
