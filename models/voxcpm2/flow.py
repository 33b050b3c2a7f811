"""Flow matching for one patch: the Euler schedule, classifier-free guidance, batch-invariant noise,
per row so that a row's result does not depend on its batch (docs/models/voxcpm2.md, "Flow
matching").
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from engine.llm.sampler import uniform_noise

__all__ = ["NOISE_SALT", "NoiseFn", "Schedule", "euler_solve", "patch_noise", "schedule"]

NOISE_SALT = 0x5F3759DF  # the flow noise's stream (distinct from token sampling's salts)

# (seeds [B], patch index [B], feat_dim, patch_size) -> noise [B, D, P] float32
NoiseFn = Callable[[Tensor, Tensor, int, int], Tensor]


def patch_noise(seeds: Tensor, steps: Tensor, feat_dim: int, patch_size: int) -> Tensor:
    """Standard normal noise [B, D, P] from (seed, patch index, element) only."""
    n = feat_dim * patch_size
    u = uniform_noise(seeds, steps, 2 * n, salt=NOISE_SALT)  # [B, 2n] in (0, 1)
    r = torch.sqrt(-2.0 * torch.log(u[:, :n]))
    z = r * torch.cos((2 * math.pi) * u[:, n:])
    return z.view(-1, feat_dim, patch_size)


class Schedule:
    """One step count's Euler schedule as the reference computes it (float32 on the host).

    ``t[j]``, ``dt[j]``: the time and step of update j (0-based, j < n); ``live[j]``: whether
    update j uses the estimator (False for the CFG-zero* steps and for j >= n when padded).
    """

    def __init__(self, n: int, *, sway: float = 1.0) -> None:
        if n < 1:
            raise ValueError(f"flow-matching steps must be >= 1, got {n}")
        span = torch.linspace(1, 0, n + 1, dtype=torch.float32)
        span = span + sway * (torch.cos(torch.pi / 2 * span) - 1 + span)
        zero_steps = max(1, int(len(span) * 0.04))
        t, dt = span[0], span[0] - span[1]
        ts, dts, live = [], [], []
        for step in range(1, len(span)):
            ts.append(float(t))
            dts.append(float(dt))
            live.append(step > zero_steps)
            t = t - dt
            if step < len(span) - 1:
                dt = t - span[step + 1]
        self.n, self.t, self.dt, self.live = n, ts, dts, live

    def padded(self, length: int) -> tuple[list[float], list[float], list[bool]]:
        """(t, dt, live) padded to ``length`` updates with no-op steps."""
        if length < self.n:
            raise ValueError(f"schedule of {self.n} steps does not fit {length}")
        pad = length - self.n
        return self.t + [0.0] * pad, self.dt + [0.0] * pad, self.live + [False] * pad


def schedule(n: int) -> Schedule:
    return Schedule(n)


def euler_solve(estimator: Callable[..., Tensor], z: Tensor, mu: Tensor, cond: Tensor, *, t: Tensor, dt: Tensor,
                live: Tensor, cfg: Tensor, mean_mode: bool = False) -> Tensor:
    """Integrate one patch per row.

    z [B, D, P] noise, mu [B, M] condition, cond [B, D, P'] previous patch, t/dt [B, K] float32,
    live [B, K] bool (the updates that apply), cfg [B] guidance scales -> x [B, D, P].
    Update 0 is never live in the reference's schedules (CFG-zero*), so it is skipped.
    """
    b = z.shape[0]
    x = z
    mu_in = torch.cat((mu, torch.zeros_like(mu)), dim=0)  # [2B, M]: conditional, then unconditional
    cond_in = torch.cat((cond, cond), dim=0)
    g = cfg.to(x.dtype).view(b, 1, 1)
    for j in range(1, t.shape[1]):
        tj = t[:, j].to(x.dtype)
        t_in = torch.cat((tj, tj))
        dt_in = torch.cat((dt[:, j], dt[:, j])).to(x.dtype) if mean_mode else torch.zeros_like(t_in)
        v = estimator(torch.cat((x, x), dim=0), mu_in, t_in, cond_in, dt_in)  # [2B, D, P]
        vc, vu = v[:b], v[b:]
        st = ((vc.reshape(b, -1) * vu.reshape(b, -1)).sum(1, keepdim=True)
              / ((vu.reshape(b, -1) ** 2).sum(1, keepdim=True) + 1e-8)).view(b, 1, 1)
        v = vu * st + g * (vc - vu * st)
        step = x - dt[:, j].to(x.dtype).view(b, 1, 1) * v
        x = torch.where(live[:, j].view(b, 1, 1), step, x)
    return x
