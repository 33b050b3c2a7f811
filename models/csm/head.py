"""What the runtime runs inside the step for CSM: the forward (packed ids -> backbone hidden) and
the token head (hidden -> a whole frame of 32 codebooks), sharing per-slot device state
(docs/models/csm.md, "How a segment runs").
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from engine.llm.sampler import Sampler, gumbel_noise_salts
from engine.llm.token_head import RowInputs
from models.csm.model import LAST_FRAME, STOP, CsmModel

__all__ = ["CsmForward", "CsmHead", "CsmSlots"]


class CsmSlots:
    """Per-slot device state shared by the forward and the head."""

    def __init__(self, model: CsmModel, max_num_seqs: int, pool: Tensor, device: torch.device | str) -> None:
        k = model.config.num_codebooks
        self.last_codes = torch.zeros(max_num_seqs + 1, k, dtype=torch.int64, device=device)  # [S, K]
        self.pool = pool  # [P, K] int64: the context frames (row 0: all zeros)
        self.scratch_row = max_num_seqs


class CsmForward:
    """The step's forward for the runtime (``uses_token_rows``)."""

    def __init__(self, model: CsmModel, slots: CsmSlots) -> None:
        self.model = model
        self.slots = slots

    def __call__(self, ids: Tensor, positions: Tensor, attn: Any, token_rows: Tensor) -> Tensor:
        last = self.slots.last_codes.index_select(0, token_rows)  # [T, K]
        x = self.model.embed(ids, self.slots.pool, last)  # [T, H]
        return self.model(x, positions, attn)


class CsmHead:
    """``TokenHead``: one frame per row (see the module docstring)."""

    def __init__(self, model: CsmModel, slots: CsmSlots) -> None:
        self.model = model
        self.slots = slots
        self.num_columns = 1 + model.config.num_codebooks
        self.eos = model.config.codebook_eos_token_id
        self.sampler = Sampler()

    def reset(self, rows: Tensor) -> None:
        pass  # the slot's last frame is written by its prompt's own last row before it is read

    def sample(self, hidden: Tensor, r: RowInputs) -> tuple[Tensor, Tensor]:
        no_penalty = torch.ones_like(r.repetition_penalty)

        k = self.model.config.num_codebooks
        # every codebook's noise in one draw (salt k for codebook k), not one per codebook
        noise = None if r.all_greedy else gumbel_noise_salts(r.seeds, r.steps, self.model.config.codebook_size,
                                                            range(k))

        settings = self.sampler.rows(r.temperature, r.top_p, r.top_k)  # once for every codebook

        def sample(logits: Tensor, salt: int) -> Tensor:
            return self.sampler(logits, settings=settings,
                                repetition_penalty=no_penalty, seeds=r.seeds, steps=r.steps,
                                all_greedy=r.all_greedy, any_top_p=r.any_top_p, salt=salt,
                                noise=None if noise is None else noise[salt])

        code0 = sample(self.model.codebook0_logits(hidden), 0)  # [B]
        codes = self.model.decode_frame(hidden, code0, sample)  # [B, K]
        self.slots.last_codes.index_copy_(0, r.rows, codes)
        stop = (codes[:, :-1] == self.eos).all(dim=1)  # [B]
        col0 = torch.where(stop, torch.full_like(code0, STOP), torch.full_like(code0, LAST_FRAME))
        return torch.cat((col0[:, None], codes), dim=1), codes
