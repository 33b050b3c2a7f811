"""Kyutai TTS's temporal transformer over the runtime's paged attention, gpt-fast style.

One position per frame; the row's input id carries nothing: ``forward`` reads the slot's
previous frame through ``token_rows`` (docs/models/kyutai_tts.md, "Temporal transformer").
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.kyutai_tts.conditioning import ConditionProvider, VoiceBank
from models.kyutai_tts.config import KyutaiTTSConfig, LMConfig
from models.kyutai_tts.depformer import silu_mul
from models.kyutai_tts.layers import DemuxEmbedding, Gating, RMSNorm, ScaledEmbedding, demux_rows, gating_hidden
from models.mimi.modules import rope_table, rotate

__all__ = ["AttentionBackend", "BackboneFns", "KyutaiLM", "PLAIN_BACKBONE", "SlotInputs", "as_traced", "embed_frame",
           "rope_cos_sin", "rotate_real"]


class AttentionBackend(Protocol):
    def __call__(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """q/k/v [T, H, D] (RoPE applied) -> o [T, H, D]; stores k/v; causal over ``context`` frames."""
        ...


def as_traced(x: Tensor) -> Tensor:
    """A 1-D input of a compiled piece as the pieces were traced with it at load: stride 1, and
    inside inference mode an inference tensor. The runtime's CUDA graphs are captured in
    inference mode over static inputs made outside it (normal tensors), which fail dynamo's
    dispatch-key guard; with the frozen stance the piece then runs uncompiled in every captured
    step (in ``kyutai_parts`` on 45c1f5da the head's text-only step launched 237 kernels
    against 26). A copy where either differs (one small kernel)."""
    if x.stride(0) == 1 and (x.is_inference() or not torch.is_inference_mode_enabled()):
        return x
    return x.clone(memory_format=torch.contiguous_format)


def rope_cos_sin(positions: Tensor, dim: int, max_period: float) -> Tensor:
    """``rope_table``'s rotations as real pairs: float32 [..., T, 1, D/2, 2] (cos, sin)."""
    ds = torch.arange(dim // 2, device=positions.device, dtype=torch.float32)
    freqs = torch.exp(ds * (-math.log(max_period) * 2 / dim))  # [D/2]
    ang = positions.float()[..., None, None] * freqs  # [..., T, 1, D/2]
    return torch.stack((torch.cos(ang), torch.sin(ang)), dim=-1)


def rotate_real(x: Tensor, cs: Tensor) -> Tensor:
    """``rotate`` with ``rope_cos_sin``'s table: x's interleaved pairs (xr, xi) -> (xr cos - xi
    sin, xr sin + xi cos) in float32, rounded to x's dtype; written out so that ``torch.compile``
    makes it one kernel (the complex product is three)."""
    d = x.shape[-1]
    pairs = x.float().view(*x.shape[:-1], d // 2, 2)
    xr, xi, c, s = pairs[..., 0], pairs[..., 1], cs[..., 0], cs[..., 1]
    return torch.stack((xr * c - xi * s, xr * s + xi * c), dim=-1).to(x.dtype).view(x.shape)


def embed_frame(frame: Tensor, positions: Tensor, cond: Tensor, delays: Tensor, audio: Tensor, text: Tensor,
                num_active: int, card: int, text_card: int) -> Tensor:
    """``KyutaiLM.embed`` from its joined and folded tables: previous frames [T, 1 + n_q] at
    positions [T] (each stream's initial token while ``positions <= delays``; -1 and the
    codebooks past ``num_active``: zero), sum conditions [T, dim]; ``audio`` the codebooks'
    tables as one plus a zero row (``join_audio_emb``), ``text`` the demultiplexed text
    embedding folded (``fold_text_emb``) -> [T, dim]. Plain, some 30 kernels; compiled, a few."""
    n_q = frame.shape[1] - 1
    is_init = positions[:, None] <= delays[None, :]  # [T, 1 + n_q]
    active = torch.arange(1 + n_q, device=frame.device) <= num_active
    inputs = torch.where(active[None, :], frame, -1)
    initial = torch.full_like(inputs, card)
    initial[:, 0] = text_card
    inputs = torch.where(is_init, initial, inputs)
    codes = inputs[:, 1:]
    offsets = torch.arange(n_q, device=frame.device) * (card + 1)
    rows = torch.where(codes < 0, audio.shape[0] - 1, codes + offsets)  # -1: the zero row
    x = F.embedding(rows, audio).sum(dim=1)  # (float32 accumulation, rounded once)
    first, second = demux_rows(inputs[:, 0], text_card + 1, text.shape[0] - 1)
    x = x + (F.embedding(first, text) + F.embedding(second, text))
    return x + cond.to(x.dtype)


class BackboneFns(NamedTuple):
    """The temporal transformer's pointwise pieces: plain (RoPE as one complex product, three
    kernels a layer, its table some seven a step; the gating's silu and product, two; the input
    embedding some 30), or through ``torch.compile`` (``compiled``: one kernel each, a few for
    the embedding; with ``kyutai_compile``, docs/models/kyutai_tts.md)."""

    table: Callable[[Tensor, int, float], Tensor]  # (positions, head_dim, max_period) -> what ``rotate`` takes
    rotate: Callable[[Tensor, Tensor], Tensor]  # (x [..., D], table broadcast to its pairs) -> x rotated
    silu_mul: Callable[[Tensor], Tensor] | None  # [T, 2, H] -> [T, H]; None: ``Gating``'s own
    embed: Callable[..., Tensor]  # ``embed_frame``'s contract

    @classmethod
    def compiled(cls, backend: str | Callable = "inductor") -> BackboneFns:
        def wrap(f: Callable) -> Callable:
            return torch.compile(f, dynamic=True, fullgraph=True, backend=backend)

        return cls(wrap(rope_cos_sin), wrap(rotate_real), wrap(silu_mul), wrap(embed_frame))


PLAIN_BACKBONE = BackboneFns(rope_table, rotate, None, embed_frame)


class SlotInputs:
    """Per-slot device state the forward reads (``max_slots + 1`` rows, the last for padding).

    ``frame_in`` [S, 1 + n_q] int64: each slot's last generated frame (the machine's text
    output, then the codebooks; -1 = zero); ``cond_sum`` [S, dim]: the turn's sum condition;
    ``voice_row`` [S]: the slot's row in ``bank`` (the voices' cross-attention keys/values)."""

    def __init__(self, config: KyutaiTTSConfig, max_slots: int, bank: VoiceBank, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        s = max_slots + 1
        self.max_slots = max_slots
        self.frame_in = torch.full((s, 1 + config.lm.n_q), -1, dtype=torch.int64, device=device)
        self.cond_sum = torch.zeros(s, config.lm.dim, dtype=dtype, device=device)
        self.voice_row = torch.zeros(s, dtype=torch.int64, device=device)
        self.bank = bank


class _Attention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.in_projs = nn.ModuleList([nn.Linear(dim, 3 * dim, bias=False)])
        self.out_projs = nn.ModuleList([nn.Linear(dim, dim, bias=False)])


class _Layer(nn.Module):
    def __init__(self, c: LMConfig, index: int) -> None:
        super().__init__()
        self.index, self.heads, self.head_dim = index, c.num_heads, c.head_dim
        self.norm1 = RMSNorm(c.dim)
        self.self_attn = _Attention(c.dim)
        if c.cross_attention:
            self.norm_cross = nn.LayerNorm(c.dim, eps=1e-5)
            self.cross_attention = _Attention(c.dim)
        self.norm2 = RMSNorm(c.dim)
        self.gating = Gating(c.dim, c.dim_feedforward)

    def forward(self, x: Tensor, table: Tensor, attn: AttentionBackend, voice_rows: Tensor | None,
                bank: VoiceBank | None, fns: BackboneFns = PLAIN_BACKBONE) -> Tensor:
        """x [T, dim], ``table`` the step's RoPE rotations (``fns.table`` of its positions)."""
        t, h, d = x.shape[0], self.heads, self.head_dim
        qkv = self.self_attn.in_projs[0](self.norm1(x)).view(t, 3, h, d)
        q, k = fns.rotate(qkv[:, :2], table[:, None]).unbind(1)  # q and k in one rotation
        v = qkv[:, 2]
        # Each residual sum in its projection's matmul (addmm: one kernel, not two).
        x = torch.addmm(x, attn(self.index, q, k, v).reshape(t, h * d), self.self_attn.out_projs[0].weight.t())
        if bank is not None:
            w = self.cross_attention.in_projs[0].weight
            cq = F.linear(self.norm_cross(x), w[: h * d]).view(t, h, d)
            x = torch.addmm(x, bank.attend(self.index, cq, voice_rows), self.cross_attention.out_projs[0].weight.t())
        return self.gating.add_to(x, self.norm2(x), fns.silu_mul)


class _Transformer(nn.Module):
    def __init__(self, c: LMConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(c, i) for i in range(c.num_layers))


class KyutaiLM(nn.Module):
    """The whole ``LMModel`` checkpoint: temporal transformer, depth transformer, conditioners."""

    def __init__(self, config: KyutaiTTSConfig) -> None:
        from models.kyutai_tts.depformer import DepformerLayers

        super().__init__()
        self.config = config
        c = config.lm
        self.emb = nn.ModuleList(ScaledEmbedding(c.card + 1, c.dim) for _ in range(c.n_q))
        text_emb = DemuxEmbedding if c.demux_second_stream else ScaledEmbedding
        self.text_emb = text_emb(c.text_card + 1, c.dim)
        self.text_linear = nn.Linear(c.dim, c.text_card, bias=False)
        self.transformer = _Transformer(c)
        self.out_norm = RMSNorm(c.dim)
        r = c.depformer_low_rank_embeddings
        self.depformer_in = nn.ModuleList(nn.Linear(c.dim, c.depformer_dim, bias=False)
                                          for _ in range(c.num_depformer_weights))
        self.depformer_emb = nn.ModuleList(ScaledEmbedding(c.card + 1, c.depformer_dim, low_rank=r)
                                           for _ in range(c.dep_q - 1))
        self.depformer_text_emb = (DemuxEmbedding if c.demux_second_stream else ScaledEmbedding)(
            c.text_card + 1, c.depformer_dim, low_rank=r)
        # Filled by ``join_depformer_in`` (at load): the input projections' weights as one tensor.
        self.register_buffer("depformer_in_joint", None, persistent=False)
        # Filled by ``join_audio_emb`` (at load): the audio embeddings' tables as one, plus a zero row.
        self.register_buffer("audio_emb_joint", None, persistent=False)
        # Filled by ``fold_depformer_emb`` (at load): the depth transformer's input embeddings
        # through their low-rank projections, [dep_q - 1, card + 1, depformer_dim], and the text's
        # two demultiplexed halves, [2 * (text_card + 1) + 1, depformer_dim] (a last row of zeros).
        self.register_buffer("depformer_emb_folded", None, persistent=False)
        # Filled by ``fold_text_emb`` (at load): the text embedding's two halves through their
        # projections, [2 * (text_card + 1) + 1, dim] (a last row of zeros).
        self.register_buffer("text_emb_folded", None, persistent=False)
        self.register_buffer("depformer_text_folded", None, persistent=False)
        self.depformer = DepformerLayers(c)
        self.linears = nn.ModuleList(nn.Linear(c.depformer_dim, c.card, bias=False) for _ in range(c.dep_q))
        self.condition_provider = ConditionProvider(config.condition, c.dim)
        self.slots: SlotInputs | None = None  # attached by the program (or a test)
        self.fns = PLAIN_BACKBONE  # (``compile_backbone``)
        self.frozen_stance: str | None = None  # set once the compiled pieces are warm
        self.num_active = config.tts.n_q  # codebooks generated (the others are fed as zero)
        delays = torch.tensor(c.delays, dtype=torch.int64)
        self.register_buffer("delays", delays, persistent=False)

    @torch.no_grad()
    def join_depformer_in(self) -> None:
        """The depth transformer's input projections as consecutive rows of one tensor,
        ``depformer_in_joint`` [num_depformer_weights * depformer_dim, dim], each
        ``depformer_in.<i>.weight`` a view of it (no second copy): ``decode_frame`` projects the
        temporal hidden for every weight set of a frame in one matmul, not one per codebook."""
        joint = torch.cat([lin.weight for lin in self.depformer_in])
        d = self.config.lm.depformer_dim
        for i, lin in enumerate(self.depformer_in):
            lin.weight = nn.Parameter(joint[i * d:(i + 1) * d], requires_grad=lin.weight.requires_grad)
        self.depformer_in_joint = joint

    @torch.no_grad()
    def join_audio_emb(self) -> None:
        """The audio codebooks' embedding tables as consecutive rows of one tensor plus a last
        row of zeros, ``audio_emb_joint`` [n_q * (card + 1) + 1, dim], each ``emb.<k>.weight`` a
        view of it (no second copy): ``embed`` looks up a frame's 32 codes in one gather and sums
        them in one reduction (three kernels, not about 130)."""
        zero = self.emb[0].weight.new_zeros(1, self.emb[0].weight.shape[1])
        joint = torch.cat([e.weight for e in self.emb] + [zero])
        n = self.config.lm.card + 1
        for k, e in enumerate(self.emb):
            e.weight = nn.Parameter(joint[k * n:(k + 1) * n], requires_grad=e.weight.requires_grad)
        self.audio_emb_joint = joint

    @torch.no_grad()
    def fold_depformer_emb(self) -> None:
        """The depth transformer's embeddings as full tables, each ``low_rank`` projection
        applied once now (in float32, rounded once): a codebook step's input is then one row of
        a table, which ``decode_frame``'s fused residual sum and norm reads itself, instead of a
        look-up and a matmul (the text's: two of each) as its own kernels. ``depformer_emb_folded``
        [dep_q - 1, card + 1, depformer_dim] (about 130 MB in bfloat16 for the 1.6B model);
        ``depformer_text_folded`` [2 * (text_card + 1) + 1, depformer_dim], ``out1`` and ``out2``
        of the demultiplexed text embedding and a zero row (only that embedding is folded)."""

        def full(table: Tensor, proj: nn.Linear | None) -> Tensor:
            return table if proj is None else (table.float() @ proj.weight.float().T).to(table.dtype)

        self.depformer_emb_folded = torch.stack([full(e.weight, e.low_rank) for e in self.depformer_emb])
        t = self.depformer_text_emb
        if isinstance(t, DemuxEmbedding):
            zero = t.weight.new_zeros(1, self.config.lm.depformer_dim)
            self.depformer_text_folded = torch.cat([full(t.weight, t.out1), full(t.weight, t.out2), zero])

    @torch.no_grad()
    def fold_text_emb(self) -> None:
        """The demultiplexed text embedding as one table, ``text_emb_folded`` ``[out1(E);
        out2(E); 0]`` [2 * (text_card + 1) + 1, dim] (float32 products rounded once; 66 MB in
        bfloat16 for the 1.6B model): ``embed`` reads a row's two tokens from it instead of two
        look-ups and two dim x dim matmuls a step. A plain (not demultiplexed) text embedding is
        left as it is."""
        t = self.text_emb
        if isinstance(t, DemuxEmbedding):
            parts = [(t.weight.float() @ o.weight.float().T).to(t.weight.dtype) for o in (t.out1, t.out2)]
            self.text_emb_folded = torch.cat([*parts, t.weight.new_zeros(1, self.config.lm.dim)])

    def compile_backbone(self, backend: str | Callable = "inductor") -> None:
        """The temporal transformer's pointwise pieces through ``torch.compile``, compiled now
        for two or more rows (dynamic) and for one; after this a call they were not compiled
        for runs them eagerly rather than compiling in the middle of serving."""
        from torch.fx.experimental import _config as fx_config

        self.fns = BackboneFns.compiled(backend)
        c = self.config.lm
        p = next(self.transformer.parameters())
        hidden = gating_hidden(c.dim, c.dim_feedforward)
        # (no duck sizing: it would tie the rows to another dimension of the same size at the trace)
        with torch.inference_mode(), fx_config.patch(use_duck_shape=False):
            for t in (2, 1):
                pos = torch.zeros(t, dtype=torch.int64, device=p.device)
                qkv = torch.zeros(t, 3, c.num_heads, c.head_dim, dtype=p.dtype, device=p.device)
                self.fns.rotate(qkv[:, :2], self.fns.table(pos, c.head_dim, c.max_period)[:, None])
                self.fns.silu_mul(torch.zeros(t, 2, hidden, dtype=p.dtype, device=p.device))
                if self.audio_emb_joint is not None and self.text_emb_folded is not None:
                    frame = torch.full((t, 1 + c.n_q), -1, dtype=torch.int64, device=p.device)
                    self.embed(frame, pos, torch.zeros(t, c.dim, dtype=p.dtype, device=p.device))
        self.frozen_stance = "eager_on_recompile"

    def attach(self, slots: SlotInputs, num_active: int | None = None) -> None:
        self.slots = slots
        if num_active is not None:
            if not 1 <= num_active <= self.config.lm.n_q:
                raise ValueError(f"num_active must be in [1, {self.config.lm.n_q}], got {num_active}")
            self.num_active = num_active

    def set_voice_frames(self, frames: int) -> None:
        """The frames of the voice embeddings it will be given (a property of the voice files, not
        of the checkpoint: 125 for the published voices); sets the cross-attention length."""
        from dataclasses import replace

        if frames != self.config.condition.voice_frames:
            cond = replace(self.config.condition, voice_frames=frames)
            self.config = replace(self.config, condition=cond)
            self.condition_provider.config = cond

    def cross_kv_weights(self) -> list[Tensor]:
        """Each layer's cross-attention key/value projection [2 * dim, dim] (for ``VoiceBank.load``)."""
        dim = self.config.lm.dim
        return [layer.cross_attention.in_projs[0].weight[dim:] for layer in self.transformer.layers]

    def embed(self, frame: Tensor, positions: Tensor, cond: Tensor | None) -> Tensor:
        """Inputs of one position per row: previous frames [T, 1 + n_q] (see the module
        docstring), positions [T], sum conditions [T, dim] -> [T, dim]."""
        c = self.config.lm
        if self.audio_emb_joint is not None and self.text_emb_folded is not None and cond is not None:
            return self.fns.embed(frame, positions, cond, self.delays, self.audio_emb_joint, self.text_emb_folded,
                                  self.num_active, c.card, c.text_card)
        is_init = positions[:, None] <= self.delays[None, :]  # [T, 1 + n_q]
        active = torch.arange(1 + c.n_q, device=positions.device) <= self.num_active  # [1 + n_q]
        inputs = torch.where(active[None, :], frame, -1)
        initial = torch.full_like(inputs, c.card)
        initial[:, 0] = c.text_card
        inputs = torch.where(is_init, initial, inputs)
        joint = self.audio_emb_joint
        if joint is not None:  # one gather, one sum (float32 accumulation, rounded once)
            audio = inputs[:, 1:]  # [T, n_q]
            offsets = torch.arange(c.n_q, device=audio.device) * (c.card + 1)
            rows = torch.where(audio < 0, joint.shape[0] - 1, audio + offsets)  # -1: the zero row
            x = F.embedding(rows, joint).sum(dim=1)
        else:
            x = self.emb[0](inputs[:, 1])
            for k in range(1, c.n_q):
                x = x + self.emb[k](inputs[:, 1 + k])
        x = x + self.text_emb(inputs[:, 0])
        return x if cond is None else x + cond.to(x.dtype)

    def backbone(self, x: Tensor, positions: Tensor, attn: AttentionBackend, voice_rows: Tensor | None) -> Tensor:
        """x [T, dim] at positions [T] -> hidden [T, dim] (out_norm applied)."""
        bank = self.slots.bank if (self.slots is not None and self.config.lm.cross_attention) else None
        c = self.config.lm
        fns = self.fns
        table = fns.table(positions, c.head_dim, c.max_period)  # [T, 1, D/2(, 2)], shared by the layers
        for layer in self.transformer.layers:
            x = layer(x, table, attn, voice_rows, bank, fns)
        return self.out_norm(x)

    def forward(self, ids: Tensor, positions: Tensor, attn: AttentionBackend, token_rows: Tensor) -> Tensor:
        """The runtime's step: ids [T] (unused: inputs come from the slot state), positions [T],
        attn, token_rows [T] (each token's slot) -> hidden [T, dim]."""
        s = self.slots
        if s is None:
            raise RuntimeError("KyutaiLM.forward needs its per-slot state: call attach(SlotInputs(...)) first")
        with contextlib.nullcontext() if self.frozen_stance is None else torch.compiler.set_stance(self.frozen_stance):
            if self.fns is not PLAIN_BACKBONE:  # (compiled: its inputs as traced)
                positions = as_traced(positions)
            frame = s.frame_in.index_select(0, token_rows)
            x = self.embed(frame, positions, s.cond_sum.index_select(0, token_rows))
            return self.backbone(x, positions, attn, s.voice_row.index_select(0, token_rows))

    def text_logits(self, hidden: Tensor) -> Tensor:
        """hidden [B, dim] -> float32 text-stream logits [B, text_card]."""
        return self.text_linear(hidden).float()
