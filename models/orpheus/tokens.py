"""Orpheus audio token ids <-> SNAC codes (7 tokens a frame; docs/orpheus.md,
"Audio tokens -> codes"). ``tokens_to_codes`` raises ``ValueError`` naming a bad token;
``token_to_code`` returns ``None`` for one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from models.orpheus.prompt import AUDIO_BASE, STOP_ID

__all__ = [
    "CODEBOOK_SIZE", "TOKENS_PER_FRAME", "SAMPLES_PER_FRAME", "NUM_AUDIO_IDS",
    "token_to_code", "code_to_token", "slot_ids", "frames_to_codes", "codes_to_frames",
    "tokens_to_codes", "codes_to_tokens", "audio_token_ids", "is_audio_token",
]

CODEBOOK_SIZE = 4096
TOKENS_PER_FRAME = 7
SAMPLES_PER_FRAME = 2048  # at 24 kHz, ~85.3 ms
NUM_AUDIO_IDS = TOKENS_PER_FRAME * CODEBOOK_SIZE  # 28,672
# Frame position -> (codebook, index within the frame's share of that codebook).
_POSITION_TO_CODEBOOK = ((0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (2, 2), (2, 3))


def token_to_code(token_id: int, k: int) -> int | None:
    """Code of the k-th audio token, or None when the id is not valid at that slot."""
    code = token_id - AUDIO_BASE - CODEBOOK_SIZE * (k % TOKENS_PER_FRAME)
    return code if 0 <= code < CODEBOOK_SIZE else None


def code_to_token(code: int, k: int) -> int:
    if not 0 <= code < CODEBOOK_SIZE:
        raise ValueError(f"code must be in [0, {CODEBOOK_SIZE}), got {code}")
    return AUDIO_BASE + CODEBOOK_SIZE * (k % TOKENS_PER_FRAME) + code


def slot_ids(k: int) -> range:
    """The 4096 token ids valid as the k-th audio token."""
    start = AUDIO_BASE + CODEBOOK_SIZE * (k % TOKENS_PER_FRAME)
    return range(start, start + CODEBOOK_SIZE)


def frames_to_codes(frames: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """frames [B, n, 7] per-position codes -> codebooks [B, n], [B, 2n], [B, 4n]."""
    b, n, _ = frames.shape
    c0 = frames[:, :, 0]  # [B, n]
    c1 = frames[:, :, [1, 4]].reshape(b, 2 * n)  # [B, 2n]
    c2 = frames[:, :, [2, 3, 5, 6]].reshape(b, 4 * n)  # [B, 4n]
    return c0, c1, c2


def codes_to_frames(c0: Tensor, c1: Tensor, c2: Tensor) -> Tensor:
    """Inverse of ``frames_to_codes``: [B, n], [B, 2n], [B, 4n] -> [B, n, 7]."""
    b, n = c0.shape
    if c1.shape != (b, 2 * n) or c2.shape != (b, 4 * n):
        raise ValueError(f"codebook shapes {tuple(c0.shape)}, {tuple(c1.shape)}, {tuple(c2.shape)} "
                         "are not [B, n], [B, 2n], [B, 4n]")
    c1 = c1.view(b, n, 2)
    c2 = c2.view(b, n, 4)
    return torch.stack(
        (c0, c1[..., 0], c2[..., 0], c2[..., 1], c1[..., 1], c2[..., 2], c2[..., 3]), dim=-1
    )  # [B, n, 7]


def tokens_to_codes(ids: Sequence[int] | Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Generated audio token ids (whole frames, no stop id) -> SNAC codes [1, n], [1, 2n], [1, 4n].

    Raises ``ValueError`` if the count is not a multiple of 7 or a token is not valid at its
    slot (naming the index).
    """
    t = torch.as_tensor(ids, dtype=torch.long).flatten()  # [7n]
    if t.numel() % TOKENS_PER_FRAME != 0:
        raise ValueError(f"need whole frames of {TOKENS_PER_FRAME} tokens, got {t.numel()} tokens")
    k = torch.arange(t.numel()) % TOKENS_PER_FRAME
    codes = t - AUDIO_BASE - CODEBOOK_SIZE * k  # [7n]
    bad = ((codes < 0) | (codes >= CODEBOOK_SIZE)).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"token {int(t[i])} at index {i} is not an audio token for slot {i % TOKENS_PER_FRAME} "
            f"(valid: {slot_ids(i).start}..{slot_ids(i).stop - 1})"
        )
    return frames_to_codes(codes.view(1, -1, TOKENS_PER_FRAME))


def codes_to_tokens(c0: Tensor, c1: Tensor, c2: Tensor) -> list[int]:
    """Inverse of ``tokens_to_codes`` for one sequence ([1, n], [1, 2n], [1, 4n])."""
    frames = codes_to_frames(c0, c1, c2)  # [1, n, 7]
    if frames.shape[0] != 1:
        raise ValueError(f"expected one sequence (batch 1), got batch {frames.shape[0]}")
    if ((frames < 0) | (frames >= CODEBOOK_SIZE)).any():
        raise ValueError(f"codes must be in [0, {CODEBOOK_SIZE})")
    offsets = AUDIO_BASE + CODEBOOK_SIZE * torch.arange(TOKENS_PER_FRAME)  # [7]
    return (frames[0] + offsets).flatten().tolist()


def audio_token_ids(device: torch.device | str | None = None) -> Tensor:
    """The 28,672 audio ids (ascending) followed by ``STOP_ID``: LongTensor [28673]."""
    ids = torch.arange(AUDIO_BASE, AUDIO_BASE + NUM_AUDIO_IDS, device=device)
    return torch.cat((ids, torch.tensor([STOP_ID], device=device)))


def is_audio_token(token_id: int) -> bool:
    return AUDIO_BASE <= token_id < AUDIO_BASE + NUM_AUDIO_IDS
