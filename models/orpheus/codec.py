"""SNAC 24 kHz decoding: whole sequences, batched fixed-size windows (``decode_windows``, with
per-row validity masks and position-keyed noise), and the window-based ``StreamingDecoder``.

Why the masks and the noise, and the window/lookahead choice: docs/orpheus.md, "Codec and
streaming".
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from models.orpheus.tokens import CODEBOOK_SIZE, SAMPLES_PER_FRAME, TOKENS_PER_FRAME, frames_to_codes

__all__ = [
    "SnacDecoder", "StreamingDecoder", "WindowRequest", "decode_requests",
    "DEFAULT_WINDOW_FRAMES", "DEFAULT_LOOKAHEAD_SAMPLES", "FAST_START_LOOKAHEAD_SAMPLES",
]

LATENT_PER_FRAME = 4  # SNAC 24 kHz: hop 512 samples, codebook 0 at stride 4
DEFAULT_WINDOW_FRAMES = 6
DEFAULT_LOOKAHEAD_SAMPLES = 5120  # 2.5 frames; see StreamingDecoder
FAST_START_LOOKAHEAD_SAMPLES = 1024  # first-frame lookahead of the serving default (ramp)


def _plain_conv(m: nn.Module) -> nn.Module:
    """A plain Conv1d / ConvTranspose1d holding ``m``'s weight-normed weight, computed once."""
    # Built on the meta device, so no initialisation draws from the global RNG.
    kw = dict(stride=m.stride, padding=m.padding, dilation=m.dilation, groups=m.groups,
              bias=m.bias is not None, device="meta", dtype=m.weight.dtype)
    if isinstance(m, nn.ConvTranspose1d):
        new = nn.ConvTranspose1d(m.in_channels, m.out_channels, m.kernel_size,
                                 output_padding=m.output_padding, **kw)
    else:
        new = nn.Conv1d(m.in_channels, m.out_channels, m.kernel_size, **kw)
    new = new.to_empty(device=m.weight.device)
    with torch.no_grad():
        new.weight.copy_(m.weight)
        if m.bias is not None:
            new.bias.copy_(m.bias)
    return new


def _fold_weight_norm(module: nn.Module) -> None:
    # Replaces modules instead of parametrize.remove_parametrizations: that deletes the
    # property from the parametrized class, which a deepcopy shares with the caller's model.
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if parametrize.is_parametrized(child, "weight"):
                setattr(parent, name, _plain_conv(child))


class SnacDecoder(nn.Module):
    """Codes -> float32 audio with the SNAC 24 kHz decoder (see module docstring)."""

    def __init__(self, snac_model: nn.Module, *, noise: str = "fixed", noise_seed: int = 0,
                 noise_period_frames: int = 1024, fold_weight_norm: bool = True) -> None:
        super().__init__()
        if noise not in ("fixed", "random", "none"):
            raise ValueError(f"noise must be 'fixed', 'random' or 'none', got {noise!r}")
        if list(snac_model.vq_strides) != [4, 2, 1] or int(np.prod(snac_model.decoder_rates)) != 512:
            raise ValueError("expected a SNAC 24 kHz model (vq_strides [4, 2, 1], hop 512)")
        if snac_model.attn_window_size is not None:
            raise ValueError("SNAC models with local attention are not supported (24 kHz has none)")
        self.quantizer = copy.deepcopy(snac_model.quantizer)
        self.decoder = copy.deepcopy(snac_model.decoder)
        if fold_weight_norm:
            _fold_weight_norm(self)
        self.noise = noise
        self.sample_rate = int(snac_model.sampling_rate)
        layers = list(self.decoder.model)
        self._stem = layers[:2]  # depthwise k7 conv, k1 conv
        self._blocks = [m for m in layers if type(m).__name__ == "DecoderBlock"]
        self._head = layers[-3:]  # Snake1d, k7 conv, Tanh
        # Output steps per frame after the stem and after each upsampling block: 4, 32, 256, ...
        self._rates = [LATENT_PER_FRAME]
        for r in snac_model.decoder_rates:
            self._rates.append(self._rates[-1] * r)
        device = next(self.parameters()).device
        gen = torch.Generator().manual_seed(noise_seed)
        for i, rate in enumerate(self._rates[1:]):
            table = torch.randn(noise_period_frames * rate, generator=gen)  # [P_i]
            self.register_buffer(f"noise_table_{i}", table.to(device), persistent=False)

    def decode(self, codes: Sequence[Tensor]) -> Tensor:
        """Whole sequences: codes [B, n], [B, 2n], [B, 4n] -> audio [B, n * 2048] float32."""
        c0 = codes[0]
        start = torch.zeros(c0.shape[0], dtype=torch.long, device=c0.device)
        return self.decode_windows(codes[0], codes[1], codes[2], start)

    @torch.no_grad()
    def decode_windows(self, c0: Tensor, c1: Tensor, c2: Tensor, start_frames: Tensor,
                       valid_from: Tensor | None = None, valid_to: Tensor | None = None) -> Tensor:
        """A batch of windows of W frames -> audio [B, W * 2048] float32.

        c0 [B, W], c1 [B, 2W], c2 [B, 4W]: codes (any value in [0, 4096) where not valid);
        start_frames [B]: absolute frame index of each window's first frame (keys the noise);
        valid_from / valid_to [B] (or None = all): the real frames ``[from, to)`` of each row.
        Only the samples of real frames are meaningful. No host synchronisation.
        """
        z = self.quantizer.from_codes([c0, c1, c2])  # [B, 768, 4W]
        masks = None
        if valid_from is not None or valid_to is not None:
            w = c0.shape[1]
            lo = valid_from if valid_from is not None else torch.zeros_like(start_frames)
            hi = valid_to if valid_to is not None else torch.full_like(start_frames, w)
            masks = [self._mask(lo, hi, w, rate, z.dtype) for rate in self._rates]
        m = masks[0] if masks else None
        x = self._stem[1](self._stem[0](_masked(z, m)))  # [B, 1024, 4W]
        for i, block in enumerate(self._blocks):
            x = self._block(block, x, i, start_frames, masks[i] if masks else None,
                            masks[i + 1] if masks else None)
        snake, conv, tanh = self._head
        x = tanh(conv(_masked(snake(x), masks[-1] if masks else None)))  # [B, 1, W*2048]
        return x[:, 0].float()

    def _block(self, block: nn.Module, x: Tensor, i: int, start_frames: Tensor,
               m_in: Tensor | None, m_out: Tensor | None) -> Tensor:
        snake, up, noise_block, *units = list(block.block)
        x = up(_masked(snake(x), m_in))  # [B, C/2, T*rate]
        x = self._add_noise(noise_block, x, i, start_frames)
        for unit in units:
            s1, conv, s2, pointwise = list(unit.block)
            x = x + pointwise(s2(conv(_masked(s1(x), m_out))))
        return x

    def _add_noise(self, noise_block: nn.Module, x: Tensor, i: int, start_frames: Tensor) -> Tensor:
        if self.noise == "none":
            return x
        b, _, t = x.shape
        if self.noise == "random":
            n = torch.randn((b, 1, t), device=x.device, dtype=x.dtype)  # as the snac package
        else:
            table = getattr(self, f"noise_table_{i}")  # [P]
            pos = start_frames[:, None] * self._rates[i + 1] + torch.arange(t, device=x.device)  # [B, T]
            n = table[pos % table.numel()][:, None].to(x.dtype)  # [B, 1, T]
        return x + n * noise_block.linear(x)

    @staticmethod
    def _mask(lo: Tensor, hi: Tensor, w: int, rate: int, dtype: torch.dtype) -> Tensor:
        t = torch.arange(w * rate, device=lo.device)  # [T]
        keep = (t[None] >= lo[:, None] * rate) & (t[None] < hi[:, None] * rate)  # [B, T]
        return keep[:, None].to(dtype)  # [B, 1, T]


def _masked(x: Tensor, mask: Tensor | None) -> Tensor:
    return x if mask is None else x * mask


@dataclass(frozen=True)
class WindowRequest:
    """One window to decode for one stream; emit ``audio[emit_from:emit_to]`` of its output."""

    frames: Tensor  # [W, 7] per-position codes, zeros where not valid
    start_frame: int  # absolute index of the window's first frame (negative before the start)
    valid_from: int  # real frames of the window: [valid_from, valid_to)
    valid_to: int
    emit_from: int  # sample range (inside the window's W * 2048 samples) to emit
    emit_to: int


DEFAULT_RAMP_STEP_SAMPLES = 1024  # fast start: lookahead growth per frame (2048 minus it out per frame)


class StreamingDecoder:
    """Per-stream incremental SNAC decoding: each sample emitted exactly once.

    After ``n`` frames have arrived, samples up to ``n * 2048 - lookahead_samples`` are final:
    the decoder is a finite stack of convolutions, so a sample only depends on codes within its
    receptive field (measured by perturbing one frame: 4,757 samples = 2.32 frames each side;
    ``python -m models.orpheus.measure_streaming``). Each new frame decodes the last ``window_frames`` frames (the window ends at the
    newest frame, with the decoder's own zero padding there, and starts at frame 0's padding
    for the first frames) and emits the 2048 samples that just became final. ``finish()``
    decodes the tail against the true end, as the whole-sequence decode does.

    Defaults: W = 6 frames, lookahead 5120 samples (2.5 frames), left context
    ``(W - 1) * 2048 - 5120 = 5120`` samples. Both sides cover the receptive field, so streaming
    equals the whole-sequence decode up to float rounding (max abs difference ~1e-6 measured,
    asserted < 1e-4 in tests). Latency: the first samples leave after 3 frames = 21 generated
    tokens (1024 samples); then 2048 samples (85.3 ms) per 7 tokens; ``finish`` emits the last
    5120. Decode cost per frame: one 6-frame window. Any lookahead in [4096, 6144) gives the
    same 3-frame start, so nothing is gained by cutting into the receptive field; smaller
    lookaheads trade exactness for latency (error table in docs/orpheus.md).

    Fast start (``first_lookahead_samples``): the k-th frame (k = 1, 2, ...) uses a lookahead of
    ``min(lookahead_samples, first_lookahead_samples + (k - 1) * ramp_step_samples)`` (step 1024
    by default), so with 1024 the first
    1024 samples leave after ONE frame (7 tokens), and each later frame releases 1024 samples
    until the lookahead reaches ``lookahead_samples`` (frame 5 for the defaults); from then on
    the decoder is exact. Every sample is still emitted exactly once, and at every frame at
    least as many samples are out as without the ramp. The price: samples in the first
    ``lookahead_samples - first_lookahead_samples`` (4096, 171 ms) see less right context than
    the receptive field (errors per context in docs/orpheus.md: about 9e-2 for the first 1024
    samples, 2e-2, 6e-3, 3e-4 for the next ones) -- the stream's leading edge only.

    A larger ``ramp_step_samples`` reaches the full lookahead in fewer frames: fewer samples
    decoded with less context and less audio in frames 2-4 (1536: 1024, 512, 512, 1024 samples),
    so a player that waits for a start buffer starts a frame later but with more of the ramp's
    deficit behind it (docs/performance_history.md, "Scheduling for real time").
    """

    def __init__(self, decoder: SnacDecoder | None = None, *, window_frames: int = DEFAULT_WINDOW_FRAMES,
                 lookahead_samples: int = DEFAULT_LOOKAHEAD_SAMPLES,
                 first_lookahead_samples: int | None = None,
                 ramp_step_samples: int = DEFAULT_RAMP_STEP_SAMPLES) -> None:
        if window_frames < 1:
            raise ValueError(f"window_frames must be >= 1, got {window_frames}")
        if not 0 <= lookahead_samples <= (window_frames - 1) * SAMPLES_PER_FRAME:
            raise ValueError(
                f"lookahead_samples must be in [0, {(window_frames - 1) * SAMPLES_PER_FRAME}] "
                f"for window_frames={window_frames}, got {lookahead_samples}"
            )
        first = lookahead_samples if first_lookahead_samples is None else first_lookahead_samples
        if not 0 <= first <= lookahead_samples:
            raise ValueError(
                f"first_lookahead_samples must be in [0, {lookahead_samples}], got {first}")
        if ramp_step_samples < 1:
            raise ValueError(f"ramp_step_samples must be >= 1, got {ramp_step_samples}")
        self.decoder = decoder
        self.ramp_step_samples = ramp_step_samples
        self.window_frames = window_frames
        self.lookahead_samples = lookahead_samples
        self.first_lookahead_samples = first
        self.num_frames = 0
        self.num_emitted = 0  # samples handed out so far
        self.is_finished = False
        # The last W frames [W, 7]; numpy, since per-frame torch calls on tiny CPU tensors cost
        # ~100 us each and the engine pushes one frame per stream every 7 steps.
        self._recent = np.zeros((window_frames, TOKENS_PER_FRAME), dtype=np.int64)

    def push_frame(self, codes: Sequence[int] | Tensor) -> WindowRequest | None:
        """Add one frame (7 per-position codes); the window to decode if samples became final."""
        if self.is_finished:
            raise ValueError("push_frame after finish")
        frame = codes.flatten().tolist() if isinstance(codes, Tensor) else [int(c) for c in codes]
        if len(frame) != TOKENS_PER_FRAME or not all(0 <= c < CODEBOOK_SIZE for c in frame):
            raise ValueError(f"a frame is {TOKENS_PER_FRAME} codes in [0, {CODEBOOK_SIZE}), got {codes!r}")
        recent = self._recent
        recent[:-1] = recent[1:]
        recent[-1] = frame
        self.num_frames += 1
        lookahead = min(self.lookahead_samples,
                        self.first_lookahead_samples + (self.num_frames - 1) * self.ramp_step_samples)
        return self._request(self.num_frames * SAMPLES_PER_FRAME - lookahead)

    def finish(self) -> WindowRequest | None:
        """End of stream: the window that emits the remaining samples (None if there are none)."""
        self.is_finished = True
        return self._request(self.num_frames * SAMPLES_PER_FRAME)

    def _request(self, final_upto: int) -> WindowRequest | None:
        if final_upto <= self.num_emitted or self.num_frames == 0:
            return None
        w, n = self.window_frames, self.num_frames
        start = n - w  # window = frames [n - W, n), ending at the newest frame
        valid_from = max(0, -start)
        window = self._recent.copy()
        window[:valid_from] = 0
        frames = torch.from_numpy(window)
        base = start * SAMPLES_PER_FRAME
        req = WindowRequest(frames, start, valid_from, w, self.num_emitted - base, final_upto - base)
        self.num_emitted = final_upto
        return req

    def push(self, codes: Sequence[int] | Tensor) -> np.ndarray:
        """``push_frame`` and decode it now with ``self.decoder``: the new samples (maybe empty)."""
        return self._run(self.push_frame(codes))

    def flush(self) -> np.ndarray:
        """``finish`` and decode it now: the last samples."""
        return self._run(self.finish())

    def _run(self, req: WindowRequest | None) -> np.ndarray:
        if req is None:
            return np.zeros(0, dtype=np.float32)
        if self.decoder is None:
            raise ValueError("this StreamingDecoder has no decoder; use decode_requests")
        return decode_requests(self.decoder, [req])[0]


def decode_requests(decoder: SnacDecoder, requests: Sequence[WindowRequest]) -> list[np.ndarray]:
    """Decode the windows of several streams in one batch; each stream's new samples."""
    if not requests:
        return []
    device = decoder.noise_table_0.device
    frames = torch.stack([r.frames for r in requests]).to(device)  # [B, W, 7]
    c0, c1, c2 = frames_to_codes(frames)
    start = torch.tensor([r.start_frame for r in requests], device=device)
    lo = torch.tensor([r.valid_from for r in requests], device=device)
    hi = torch.tensor([r.valid_to for r in requests], device=device)
    audio = decoder.decode_windows(c0, c1, c2, start, lo, hi).cpu()  # [B, W*2048]
    return [audio[i, r.emit_from:r.emit_to].numpy() for i, r in enumerate(requests)]
