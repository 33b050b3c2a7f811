"""CSM's Mimi against transformers' MimiModel (the checkpoint's codec_model.*): decode, encode of
whole and ragged lengths, and the per-slot streaming decode equal to the whole decode."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.models.csm.csm_fixtures import CODEC_WAVS, jobs


@pytest.fixture(scope="module")
def mimi(ckpt_root) -> Any:
    from models.csm.loader import load_csm

    return load_csm(ckpt_root / "main", dtype=torch.float32).mimi


def test_mimi_from_transformers_keys_decodes_as_the_reference(mimi, reference) -> None:
    """The checkpoint's transformers Mimi weights, mapped to moshi's names (q/k rows un-permuted),
    decode random codes to the reference's waveform."""
    codes = torch.tensor(jobs()["codec"]["codes"])
    with torch.no_grad():
        ours = mimi.decode(codes)
    ref = reference["codec"]["decode"]
    assert ours.shape == ref.shape == (2, 1, 12 * 1920) and ref.abs().max() > 1e-3  # (not silent)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("i, name", list(enumerate(CODEC_WAVS)))
def test_encode_frames_gives_the_reference_codes(mimi, reference, i: int, name: str) -> None:
    """encode_frames (the reference's per-convolution padding) gives the reference's 32 codebooks
    for a whole number of frames and for ragged lengths."""
    from models.csm.codec import encode_frames

    wav = torch.tensor(jobs()["codec"]["wavs"][i])[None, None]
    codes = encode_frames(mimi, wav, 32)[0]
    ref = reference["codec"]["encode"][i]
    assert codes.shape == ref.shape == (32, -(-CODEC_WAVS[name] // 1920))
    assert codes.equal(ref)


def test_streaming_decode_equals_the_reference_whole_decode(mimi, reference) -> None:
    """MimiDecodeStream, one frame per call and two streams in their own slots (the second joining
    four frames later, a padding row beside them), gives the reference's whole decode."""
    from models.mimi.stream import MimiDecodeStream

    codes = torch.tensor(jobs()["codec"]["codes"])  # [2, 32, 12]
    ref = reference["codec"]["decode"][:, 0]  # [2, S]
    stream = MimiDecodeStream(mimi, 4, num_codebooks=32)
    stream.reset(torch.tensor([1, 3]))
    out: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    for t in range(12 + 4):
        rows = [(b, t - 4 * b) for b in (0, 1) if 0 <= t - 4 * b < 12]
        slots = torch.tensor([1 + 2 * b for b, _ in rows] + [stream.scratch_slot])
        frame = torch.stack([codes[b, :, f] for b, f in rows] + [codes[0, :, 0]])
        pcm = stream.step(slots, frame)
        for (b, _), p in zip(rows, pcm):
            out[b].append(p)
    for b in (0, 1):
        torch.testing.assert_close(torch.cat(out[b]), ref[b], rtol=0, atol=2e-5)


def test_codec_weights_that_do_not_match_the_config_are_refused(mimi) -> None:
    """A codec state with a missing tensor is refused naming it."""
    from models.csm.codec import moshi_state

    with pytest.raises(ValueError, match="missing"):
        moshi_state({"upsample.conv.weight": torch.zeros(32, 1, 4)}, mimi)
