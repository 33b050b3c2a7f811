"""Flow matching for one patch: the Euler schedule, classifier-free guidance, batch-invariant noise,
per row so that a row's result does not depend on its batch (docs/models/voxcpm2.md, "Flow
matching").
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from engine.llm.sampler import column_keys, uniform_noise
from models.voxcpm2.dit import FusedDiT

__all__ = ["NOISE_SALT", "NoiseFn", "Schedule", "euler_solve", "patch_noise", "patch_noise_keys", "schedule"]

NOISE_SALT = 0x5F3759DF  # the flow noise's stream (distinct from token sampling's salts)

# (seeds [B], patch index [B], feat_dim, patch_size) -> noise [B, D, P] float32
NoiseFn = Callable[[Tensor, Tensor, int, int], Tensor]


def patch_noise(seeds: Tensor, steps: Tensor, feat_dim: int, patch_size: int, col_keys: Tensor | None = None) -> Tensor:
    """Standard normal noise [B, D, P] from (seed, patch index, element) only (``col_keys``:
    ``patch_noise_keys(feat_dim, patch_size)`` built ahead, the same noise in fewer kernels)."""
    n = feat_dim * patch_size
    u = uniform_noise(seeds, steps, 2 * n, col_keys, salt=NOISE_SALT)  # [B, 2n] in (0, 1)
    r = torch.sqrt(-2.0 * torch.log(u[:, :n]))
    z = r * torch.cos((2 * math.pi) * u[:, n:])
    return z.view(-1, feat_dim, patch_size)


def patch_noise_keys(feat_dim: int, patch_size: int, device: torch.device | str | None = None) -> Tensor:
    """The column keys ``uniform_noise`` hashes for ``patch_noise``'s 2 * D * P columns."""
    return column_keys(2 * feat_dim * patch_size, torch.device(device or "cpu"))


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


def euler_solve(dit: FusedDiT, z: Tensor, mu: Tensor, cond: Tensor, *, t: Tensor, dt: Tensor, live: Tensor,
                cfg: Tensor, mean_mode: bool = False) -> Tensor:
    """Integrate one patch per row.

    ``dit`` the estimator (``models.voxcpm2.dit.FusedDiT``), z [B, P, D] noise (frames first),
    mu [B, M] condition, cond [B, P, D] previous patch, t/dt [B, K] float32, live [B, K] bool (the
    updates that apply), cfg [B] guidance scales -> x [B, P, D].
    Update 0 is never live in the reference's schedules (CFG-zero*), so it is skipped. What is
    the same at every update (the condition, the previous patch, the time embeddings of all
    updates, a masked update's zero step) is computed once, before the loop.
    """
    b = z.shape[0]
    x = z
    dtype = x.dtype
    tj = t[:, 1:].to(dtype)  # [B, K - 1]
    prefix = dit.prefix(mu, cond, tj, dt[:, 1:].to(dtype) if mean_mode else torch.zeros_like(tj))
    g = cfg.to(dtype).view(b, 1, 1)
    # -dt where the update applies, 0 where it is masked (x stays as it is: x + 0 * v)
    step = torch.where(live[:, 1:], -dt[:, 1:], torch.zeros_like(dt[:, 1:])).to(dtype).T.reshape(-1, b, 1, 1)
    for j in range(t.shape[1] - 1):
        v = dit.velocity(prefix[j], x)  # [2, B, P, D]: conditional, unconditional
        vc, vu = v[0], v[1]
        s = (v * vu).sum(dim=(2, 3))  # [2, B]: <v_c, v_u>, |v_u|^2
        st = (s[0] / (s[1] + 1e-8)).view(b, 1, 1)
        vs = vu * st
        x = torch.addcmul(x, step[j], torch.lerp(vs, vc, g))  # x - dt * (s* v_u + cfg (v_c - s* v_u))
    return x
