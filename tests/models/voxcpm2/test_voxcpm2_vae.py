"""AudioVAE parity with voxcpm 2.0.3 and the streaming decoder: whole decode, encoder, chunked
streaming equal to the whole decode, slots at different offsets, reset."""

from __future__ import annotations

import pytest
import torch
from tests.models.voxcpm2.voxcpm2_fixtures import JOBS

from models.voxcpm2.vae import VAEStream

REL = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def _z() -> torch.Tensor:
    return torch.tensor(JOBS["vae"]["latents"])  # [D, 24]


def test_whole_decode_equals_reference(ours, reference):
    """AudioVAE.decode (weight norm folded at load) equals the reference's decode."""
    with torch.no_grad():
        got = ours.vae.decode(_z()[None])[0]
    assert got.shape == reference["vae"]["whole"].shape
    assert _rel(got, reference["vae"]["whole"]) < REL


def test_encoder_equals_reference(ours, reference):
    """AudioVAE.encode (float32, right-padded to whole frames) equals the reference's mu."""
    with torch.no_grad():
        got = ours.vae.encode(torch.tensor(JOBS["vae"]["wav"])[None])[0]
    assert _rel(got, reference["vae"]["encoded"]) < REL


@pytest.mark.parametrize("chunk", [4, 8, 5])
def test_streaming_equals_whole_decode(ours, reference, chunk):
    """Chunks of ``chunk`` frames (the last one zero-padded and cut) concatenated equal the
    reference's whole decode; each chunk is decoded once."""
    z = _z()
    stream = VAEStream(ours.vae, max_slots=2, chunk_frames=chunk)
    slots = torch.tensor([1])
    stream.reset(slots)
    hop = ours.config.vae.decode_hop
    pieces = []
    with torch.no_grad():
        for i in range(0, z.shape[1], chunk):
            part = z[:, i:i + chunk]
            n = part.shape[1]
            part = torch.nn.functional.pad(part, (0, chunk - n))
            pieces.append(stream.step(slots, part[None])[0][: n * hop])
    assert stream.delay_samples == 0
    assert _rel(torch.cat(pieces), reference["vae"]["whole"]) < REL


def test_slots_at_different_offsets_equal_each_alone(ours):
    """Three slots starting at different chunks, batched with a padding row on the scratch slot,
    each equal their own whole decode; a used slot restarts cleanly after reset."""
    g = torch.Generator().manual_seed(11)
    d = ours.config.feat_dim
    seqs = [torch.randn(d, n * 4, generator=g) for n in (5, 3, 2)]
    starts = [0, 1, 3]
    stream = VAEStream(ours.vae, max_slots=3, chunk_frames=4)
    slot_of = {0: 2, 1: 0, 2: 1}
    for s in (0, 1, 2):  # dirty every slot first
        stream.step(torch.tensor([s]), torch.randn(1, d, 4, generator=g))
    out = {i: [] for i in range(3)}
    with torch.no_grad():
        solo = [ours.vae.decode(s[None])[0] for s in seqs]
        for t in range(5):
            rows = [i for i in range(3) if starts[i] <= t < starts[i] + seqs[i].shape[1] // 4]
            for i in rows:
                if t == starts[i]:
                    stream.reset(torch.tensor([slot_of[i]]))
            slots = torch.tensor([slot_of[i] for i in rows] + [stream.scratch_slot])
            z = torch.stack([seqs[i][:, (t - starts[i]) * 4:(t - starts[i] + 1) * 4] for i in rows]
                            + [torch.zeros(d, 4)])
            pcm = stream.step(slots, z)
            for j, i in enumerate(rows):
                out[i].append(pcm[j])
    for i in range(3):
        assert _rel(torch.cat(out[i]), solo[i]) < REL, i


def test_step_refuses_other_chunk_lengths(ours):
    """Static shapes: a chunk of another length is an error, not a silent recompile."""
    stream = VAEStream(ours.vae, max_slots=1, chunk_frames=4)
    with pytest.raises(ValueError, match="4 frames"):
        stream.step(torch.tensor([0]), torch.zeros(1, ours.config.feat_dim, 3))


def test_decoder_dtype_is_independent(ckpt_root):
    """The VAE decoder can load in another dtype than the language side; the encoder stays float32."""
    from models.voxcpm2.loader import load_voxcpm2

    loaded = load_voxcpm2(ckpt_root / "base", dtype=torch.float32, vae_decoder_dtype=torch.bfloat16)
    assert loaded.vae.decoder.model[-2].weight.dtype == torch.bfloat16
    assert loaded.vae.encoder.fc_mu.weight.dtype == torch.float32
    assert loaded.model.stop_head.weight.dtype == torch.float32
    with torch.no_grad():
        assert loaded.vae.decode(_z()[None]).dtype == torch.bfloat16
