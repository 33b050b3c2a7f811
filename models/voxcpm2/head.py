"""``PatchHead``: the runtime's token head for VoxCPM2, run inside the captured step: a patch of
latents per row and a stop flag (docs/models/voxcpm2.md, "The token head").
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from engine.llm.token_head import RowInputs
from models.voxcpm2.dit import FusedDiT
from models.voxcpm2.flow import NoiseFn, euler_solve, patch_noise, patch_noise_keys, schedule
from models.voxcpm2.model import LAST_PATCH, STOP, SlotFeatures, VoxCPM2Model

__all__ = ["NO_CAP", "PatchHead"]

NO_CAP = 2**62  # a slot's max_len when it has none


class PatchHead:
    num_columns = 2

    def __init__(self, model: VoxCPM2Model, feats: SlotFeatures, *, max_num_seqs: int, max_steps: int = 10,
                 ring_patches: int = 16, noise: NoiseFn = patch_noise) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if ring_patches < 1:
            raise ValueError(f"ring_patches must be >= 1, got {ring_patches}")
        c = model.config
        dev = feats.last.device
        self.model, self.feats = model, feats
        # the default noise with its column keys built here, once (not hashed again every call)
        self.noise = partial(patch_noise, col_keys=patch_noise_keys(c.feat_dim, c.patch_size, dev)) \
            if noise is patch_noise else noise
        # the DiT's fused weights and tables, from the weights as they are now (after any LoRA fold)
        self.dit = FusedDiT(model.feat_decoder.estimator, c.dit_lm, c.patch_size)
        self.max_steps, self.ring_patches = max_steps, ring_patches
        self.patch_size, self.feat_dim = c.patch_size, c.feat_dim
        rows = max_num_seqs + 1  # the last row is the padding rows'
        self.ring = torch.zeros(rows, ring_patches, c.patch_size, c.feat_dim, device=dev, dtype=feats.last.dtype)
        self.done = torch.zeros(rows, dtype=torch.bool, device=dev)
        self.cfg = torch.full((rows,), 2.0, device=dev)
        self.min_len = torch.full((rows,), 2, dtype=torch.int64, device=dev)
        self.max_len = torch.full((rows,), NO_CAP, dtype=torch.int64, device=dev)
        self.t = torch.zeros(rows, max_steps, device=dev)
        self.dt = torch.zeros(rows, max_steps, device=dev)
        self.live = torch.zeros(rows, max_steps, dtype=torch.bool, device=dev)
        # Every step count's padded schedule, on the device once: ``configure`` copies device to
        # device (a copy from host memory would wait for the step in flight)
        self._schedules: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
        for n in range(1, max_steps + 1):
            t, dt, live = schedule(n).padded(max_steps)
            self._schedules[n] = (torch.tensor(t, device=dev), torch.tensor(dt, device=dev),
                                  torch.tensor(live, device=dev))
        self.configure(max_num_seqs, steps=min(10, max_steps), cfg=2.0, min_len=2)

    def configure(self, slot: int, *, steps: int, cfg: float, min_len: int, cond: Tensor | None = None,
                  max_len: int | None = None) -> None:
        """Set a slot's generation settings (host-side, before its sequence's first step);
        ``max_len``: the most patches (None: no cap of its own)."""
        if not 1 <= steps <= self.max_steps:
            raise ValueError(f"steps must be in [1, {self.max_steps}], got {steps}")
        if max_len is not None and max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        t, dt, live = self._schedules[steps]
        self.t[slot].copy_(t)
        self.dt[slot].copy_(dt)
        self.live[slot].copy_(live)
        # fill_, not ``[slot] = v``: storing a Python number in one element copies it from the
        # host, which on CUDA waits for the step in flight
        self.cfg[slot].fill_(float(cfg))
        self.min_len[slot].fill_(int(min_len))
        self.max_len[slot].fill_(NO_CAP if max_len is None else int(max_len))
        last = self.feats.last
        if cond is None:
            last[slot].fill_(0)
        else:
            last[slot] = cond.to(last.device, last.dtype)
        self.done[slot].fill_(False)

    def reset(self, rows: Tensor) -> None:
        self.done.index_fill_(0, rows, False)

    def sample(self, hidden: Tensor, r: RowInputs) -> tuple[Tensor, Tensor]:
        model, rows = self.model, r.rows
        dtype = hidden.dtype
        mu = model.dit_condition(hidden)  # [B, 2 Hd]
        last = self.feats.last
        prev = last.index_select(0, rows)  # [B, P, D]
        cond = prev.to(dtype)
        z = self.noise(r.seeds, r.steps, self.feat_dim, self.patch_size) * r.temperature.view(-1, 1, 1)
        z = z.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format)  # [B, P, D]
        x = euler_solve(self.dit, z, mu, cond, t=self.t.index_select(0, rows),
                        dt=self.dt.index_select(0, rows), live=self.live.index_select(0, rows),
                        cfg=self.cfg.index_select(0, rows), mean_mode=model.config.dit.mean_mode)
        patch = x.to(last.dtype)  # [B, P, D]
        logits = model.stop_logits(hidden.chunk(2, dim=-1)[0])  # [B, 2]
        may_stop = r.steps > self.min_len.index_select(0, rows)
        at_cap = r.steps + 1 >= self.max_len.index_select(0, rows)
        stop = ((logits[:, 1] > logits[:, 0]) & may_stop) | at_cap
        was_done = self.done.index_select(0, rows)
        write = r.keep & ~was_done  # [B]
        w = write.view(-1, 1, 1)
        last.index_copy_(0, rows, torch.where(w, patch, prev))
        ring_pos = r.steps % self.ring_patches
        self.ring[rows, ring_pos] = torch.where(w, patch, self.ring[rows, ring_pos])
        self.done.index_copy_(0, rows, was_done | (write & stop))
        col0 = torch.where(stop | was_done, STOP, LAST_PATCH)  # int64 [B]
        return torch.stack((col0, r.steps), dim=1), logits
