"""The program's chunked VAE decoding (``audio.ChunkDecoder``): chunks gathered from the ring (and
a continuation's context) and decoded once per slot equal the whole decode, whatever the chunk
size, context length and ring wrap-around; a spilled slot decodes from its copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models.voxcpm2.audio import ChunkDecoder, ChunkRow


@pytest.fixture(scope="module")
def vae():
    from models.voxcpm2.loader import load_voxcpm2

    return load_voxcpm2("tiny", load_format="dummy", dtype=torch.float32, seed=5).vae


def _patches(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, 4, 8, generator=torch.Generator().manual_seed(seed))  # [T, P, D] (tiny: P 4, D 8)


def _whole(vae, patches: torch.Tensor, context: torch.Tensor | None) -> np.ndarray:
    z = patches if context is None else torch.cat((context, patches))
    with torch.no_grad():
        wav = vae.decode(z.reshape(-1, 8).T[None])[0].numpy()
    return wav[(0 if context is None else len(context)) * 4 * 1920:]


def _stream(dec: ChunkDecoder, jobs: dict[int, tuple[torch.Tensor, torch.Tensor | None]]) -> dict[int, np.ndarray]:
    """Generate each slot's patches one step at a time into the ring, as the head does, decoding
    what is due after each step; then the final chunks."""
    rows = {s: ChunkRow(s, k, 0, k) for s, k in ((s, 0 if c is None else len(c)) for s, (_, c) in jobs.items())}
    for s, (_, c) in jobs.items():
        dec.set_context(s, c)
    out: dict[int, list[np.ndarray]] = {s: [] for s in jobs}
    r = dec.ring.shape[1]
    for i in range(max(len(p) for p, _ in jobs.values())):
        live = [s for s, (p, _) in jobs.items() if i < len(p) - 1]  # the last patch is the stop patch
        for s in live:
            dec.ring[s, i % r] = jobs[s][0][i]
            rows[s].available += 1
        got = dec.run([rows[s] for s in live], final=False)()
        for s, a in zip(live, got):
            if a is not None:
                out[s].append(a)
        ending = [s for s, (p, _) in jobs.items() if i == len(p) - 1]
        for s in ending:
            dec.ring[s, i % r] = jobs[s][0][i]
            rows[s].available += 1
        for s, a in zip(ending, dec.run([rows[s] for s in ending], final=True)()):
            if a is not None:
                out[s].append(a)
    return {s: np.concatenate(v) for s, v in out.items()}


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_chunks_equal_the_whole_decode(vae, chunk: int) -> None:
    """Three slots at once (no context, 2 and 3 context patches; 5, 8 and 13 patches: the ring of
    chunk + 4 wraps) stream to their whole decodes, context audio cut."""
    ring = torch.zeros(4, chunk + 4, 4, 8)
    dec = ChunkDecoder(vae, ring, max_slots=3, chunk_patches=chunk)
    jobs = {0: (_patches(5, 1), None), 1: (_patches(8, 2), _patches(2, 3)), 2: (_patches(13, 4), _patches(3, 5))}
    with torch.no_grad():
        got = _stream(dec, jobs)
    for s, (p, c) in jobs.items():
        assert got[s].size == len(p) * 7680
        np.testing.assert_allclose(got[s], _whole(vae, p, c), rtol=0, atol=1e-5)


def test_a_spilled_row_decodes_from_its_copy(vae) -> None:
    """``spill`` copies the slot's ring row and context; the ring row then taken over by another
    sequence does not change the spilled row's last chunk."""
    ring = torch.zeros(2, 6, 4, 8)
    dec = ChunkDecoder(vae, ring, max_slots=1, chunk_patches=2)
    p, c = _patches(3, 7), _patches(1, 8)
    row = ChunkRow(0, 1, 0, 1)
    dec.set_context(0, c)
    out = []
    with torch.no_grad():
        for i in range(3):
            ring[0, i] = p[i]
            row.available += 1
            if i < 2:
                out.append(dec.run([row], final=False)()[0])
        dec.spill(row)
        ring[0].normal_()  # the next sequence writes the slot's ring row and context
        dec.set_context(0, _patches(1, 9))
        out.append(dec.run([row], final=True)()[0])
    assert torch.equal(dec.patch(row, 2), p[2])
    np.testing.assert_allclose(np.concatenate([a for a in out if a is not None]), _whole(vae, p, c), rtol=0, atol=1e-5)


def test_a_ring_too_short_for_the_chunk_is_refused(vae) -> None:
    """The ring must hold a chunk and the steps that run before it is read."""
    with pytest.raises(ValueError, match="ring"):
        ChunkDecoder(vae, torch.zeros(2, 5, 4, 8), max_slots=1, chunk_patches=3)
