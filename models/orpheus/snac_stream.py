"""Stateful streaming SNAC 24 kHz decoding: each frame runs through the decoder once.

``StreamingSnac`` keeps each slot's convolution state and decodes one frame per row, batched,
equal to ``SnacDecoder.decode`` delayed by ``delay_samples``; ``StreamCursor`` is the host's
bookkeeping. How each layer streams: docs/codec_streaming.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from models.orpheus.codec import SnacDecoder
from models.orpheus.tokens import SAMPLES_PER_FRAME

__all__ = ["StreamingSnac", "StreamCursor", "OPEN_END_FRAMES", "stream_delay_samples"]

OPEN_END_FRAMES = 1 << 40  # end_frames of a stream still open (no real end yet)
# Frame position -> latent step of each codebook (codebook 0 repeats x4, codebook 1 x2).
_C0_IDX = (0, 0, 0, 0)
_C1_IDX = (1, 1, 4, 4)
_C2_IDX = (2, 3, 5, 6)


@dataclass(frozen=True)
class _Conv:
    """One temporal convolution's weights and geometry (weight norm folded)."""

    weight: Tensor  # [C_out, C_in / groups, k]
    bias: Tensor | None
    dilation: int
    groups: int

    @property
    def context(self) -> int:  # inputs kept between calls: the kernel span minus one
        return (self.weight.shape[-1] - 1) * self.dilation

    @property
    def pad(self) -> int:  # the 'same' padding = the output's delay
        return self.context // 2


def _conv(m: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> _Conv:
    w = m.weight.detach().to(device, dtype)
    b = None if m.bias is None else m.bias.detach().to(device, dtype)
    return _Conv(w, b, int(m.dilation[0]), int(m.groups))


def _alpha(snake: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    alpha = snake.alpha.detach().to(device, dtype)  # [1, C, 1]
    return alpha, (alpha + 1e-9).reciprocal()  # the reciprocal once, not per call


def _snake(x: Tensor, alpha: tuple[Tensor, Tensor]) -> Tensor:
    # The snac package's formula, term for term (rounding matches the whole decode).
    a, inv = alpha
    return x + inv * torch.sin(a * x).pow(2)


class _StateLayout:
    """Offsets of every per-stream state tensor [C, L] in one flat row of the pool."""

    def __init__(self) -> None:
        self.shapes: list[tuple[int, int]] = []
        self.size = 0

    def add(self, channels: int, length: int) -> int:
        self.shapes.append((channels, length))
        self.size += channels * length
        return len(self.shapes) - 1

    def views_time_major(self, flat: Tensor) -> list[Tensor]:
        """Views [B, L, C] into ``flat`` [B, size] (the channels-last path's layout)."""
        return self._views(flat, time_major=True)

    def views(self, flat: Tensor) -> list[Tensor]:
        """Views [B, C, L] into ``flat`` [B, size], in the order they were added."""
        return self._views(flat, time_major=False)

    def _views(self, flat: Tensor, *, time_major: bool) -> list[Tensor]:
        out, off = [], 0
        for c, n in self.shapes:
            out.append(flat[:, off:off + c * n].view(flat.shape[0], *((n, c) if time_major else (c, n))))
            off += c * n
        return out


def stream_delay_samples(decoder: SnacDecoder) -> int:
    """Output delay (samples) of the streamed decoder: the sum of every layer's delay."""
    stem, up, units = _geometry(decoder)
    d = stem
    for (s, p), pads in zip(up, units):
        d = d * s + p + sum(pads)
    return d + decoder._head[1].padding[0]


def _geometry(decoder: SnacDecoder) -> tuple[int, list[tuple[int, int]], list[list[int]]]:
    stem = decoder._stem[0].padding[0]
    up, units = [], []
    for block in decoder._blocks:
        _, conv_t, _, *res = list(block.block)
        up.append((int(conv_t.stride[0]), int(conv_t.padding[0])))
        units.append([int(u.block[1].padding[0]) for u in res])
    return stem, up, units


class StreamingSnac:
    """Batched per-slot streaming SNAC decoder (see the module docstring).

    ``max_streams`` slots plus one scratch slot (``scratch_slot``) that padding rows of a CUDA
    graph use. Every method is device work only: no host synchronisation, fixed shapes.

    ``channels_last=True`` runs the step on activations [B, T, C] (``snac_stream_nwc.ChannelsLastStep``): the
    pointwise convolutions, the noise projection and the ConvTranspose1d become GEMMs, the
    depthwise k7 convolutions shifted multiply-adds. ``compile=True`` (implies channels_last)
    wraps that step in ``torch.compile`` (default mode, batch dimension dynamic), which fuses
    Snake, masks, noise, state concatenation and the depthwise taps into a few kernels; the
    result can be captured in CUDA graphs (``StreamingCodecGraphs``) after one warm-up call.
    The state layout differs between the two paths (time-major when
    channels-last); the audio is the same up to float rounding.
    """

    def __init__(self, decoder: SnacDecoder, *, max_streams: int, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32, channels_last: bool = False,
                 compile: bool = False) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        if decoder.noise == "random":
            raise ValueError("streaming needs position-keyed noise: build the SnacDecoder with "
                             "noise='fixed' or 'none'")
        dev = torch.device(device) if device is not None else decoder.noise_table_0.device
        self.device, self.dtype = dev, dtype
        self.max_streams = max_streams
        self.scratch_slot = max_streams
        self.has_noise = decoder.noise == "fixed"
        self.rates = list(decoder._rates)  # steps per frame after the stem, each block: 4, 32, ...
        self.delay_samples = stream_delay_samples(decoder)
        # Flush steps a stream needs after its last real frame: ceil(D / 2048).
        self.num_flush_steps = -(-self.delay_samples // SAMPLES_PER_FRAME)
        layout = _StateLayout()

        # Quantizer: embedding + 1x1 out_proj is a per-code table [4096, 768] per codebook.
        with torch.no_grad():
            self._tables = []
            for q in decoder.quantizer.quantizers:
                emb = q.codebook.weight.t()[None]  # [1, D, 4096]
                self._tables.append(q.out_proj(emb)[0].t().contiguous().to(dev, dtype))  # [4096, 768]
        self._code_idx = [torch.tensor(i, device=dev) for i in (_C0_IDX, _C1_IDX, _C2_IDX)]

        latent = self._tables[0].shape[1]
        self._stem = (_conv(decoder._stem[0], dev, dtype), _conv(decoder._stem[1], dev, dtype))
        self._stem_state = layout.add(latent, self._stem[0].context)
        delay = self._stem[0].pad  # delay so far, at the current rate
        self._blocks = []
        for i, block in enumerate(decoder._blocks):
            snake, up, noise_block, *units = list(block.block)
            s, p = int(up.stride[0]), int(up.padding[0])
            if up.kernel_size[0] != 2 * s:
                raise ValueError(f"expected ConvTranspose1d kernel 2 * stride, got {up.kernel_size[0]}, {s}")
            b = _Block(
                alpha=_alpha(snake, dev, dtype), up=_conv(up, dev, dtype), stride=s,
                up_state=layout.add(up.in_channels, 1), in_delay=delay,
                noise_weight=noise_block.linear.weight.detach().to(dev, dtype),
                noise_table=getattr(decoder, f"noise_table_{i}").to(dev),
                units=[],
            )
            delay = delay * s + p
            b_out_delay = delay
            for unit in units:
                s1, conv, s2, pw = list(unit.block)
                c = _conv(conv, dev, dtype)
                b.units.append(_Unit(
                    alpha1=_alpha(s1, dev, dtype), conv=c, alpha2=_alpha(s2, dev, dtype),
                    pointwise=_conv(pw, dev, dtype), in_delay=delay,
                    conv_state=layout.add(conv.in_channels, c.context),
                    skip_state=layout.add(conv.in_channels, c.pad),
                ))
                delay += c.pad
            self._blocks.append((b, b_out_delay))
        snake, conv, _tanh = decoder._head
        self._head_alpha = _alpha(snake, dev, dtype)
        self._head_conv = _conv(conv, dev, dtype)
        self._head_state = layout.add(conv.in_channels, self._head_conv.context)
        self._head_in_delay = delay
        if delay + self._head_conv.pad != self.delay_samples:
            raise ValueError("internal: layer delays disagree")  # pragma: no cover
        self._layout = layout
        self._aranges = {r: torch.arange(r, device=dev) for r in self.rates}
        # Every temporal conv's input mask, by (rate, delay); computed per rate in one go.
        need = [(self.rates[0], 0), (self.rates[-1], self._head_in_delay)]
        for i, (b, _) in enumerate(self._blocks):
            need += [(self.rates[i], b.in_delay)] + [(self.rates[i + 1], u.in_delay) for u in b.units]
        self._mask_delays = {r: sorted({d for rr, d in need if rr == r}) for r in self.rates}
        self._mask_delay_t = {r: torch.tensor(d, device=dev)[:, None] for r, d in self._mask_delays.items()}
        self.state = torch.zeros(max_streams + 1, layout.size, device=dev, dtype=dtype)  # [S+1, state]
        self.frame_index = torch.zeros(max_streams + 1, dtype=torch.int64, device=dev)  # [S+1]
        self.channels_last = channels_last or compile
        self._nwc = None
        if self.channels_last:
            from models.orpheus.snac_stream_nwc import ChannelsLastStep  # (it imports this module)

            self._nwc = ChannelsLastStep(self)
        self._nwc_fn = None
        self._compile_backend = ""
        self.is_compiled = False
        if compile:
            self.use_compile(True)

    def use_compile(self, enabled: bool, *, backend: str = "inductor") -> None:
        """Run the channels-last step through ``torch.compile`` (True) or eagerly (False).

        One graph, dynamic in the batch dimension, serves every batch size (a single row runs
        as two, so batch 1 does not specialise a second graph); it is compiled lazily at the
        first call: warm up once before capturing CUDA graphs (``BatchGraphs`` does).
        ``backend`` is torch.compile's (tests use "aot_eager": same tracing, no codegen).
        Each instance is one more entry in Dynamo's cache for the same code: beyond
        ``torch._dynamo.config.recompile_limit`` (8) compiled instances in one process, the
        next ones run eagerly (same results, slower). Calls under ``torch.inference_mode``
        and under ``no_grad`` need a graph each (the inputs' dispatch keys differ): keep one
        mode per process (``BatchGraphs`` warms up and captures in inference mode).
        """
        if enabled and self._nwc is None:
            raise ValueError("compile needs the channels-last path: build StreamingSnac(channels_last=True)")
        if enabled and (self._nwc_fn is None or self._compile_backend != backend):
            # Default mode: "reduce-overhead" would capture its own CUDA graphs inside ours.
            self._nwc_fn = torch.compile(self._nwc.forward, fullgraph=True, dynamic=None, backend=backend)
            self._compile_backend = backend
        self.is_compiled = enabled

    def _compiled_forward(self, st: Tensor, c: Tensor, end: Tensor, frames: Tensor) -> tuple[Tensor, Tensor]:
        args = (st, c, end, frames)
        if st.shape[0] == 1:  # as a batch of 2 (the same row twice): no size-1 specialisation
            args = tuple(torch.cat((t, t)) for t in args)
        for t in args:
            torch._dynamo.maybe_mark_dynamic(t, 0)
        audio, new_st = self._nwc_fn(*args)
        return audio[:st.shape[0]], new_st[:st.shape[0]]

    @property
    def state_numel_per_stream(self) -> int:
        return self._layout.size

    def reset(self, slots: Tensor) -> None:
        """Forget the streams in ``slots`` [B] int64 (zero state, frame counter 0)."""
        slots = slots.to(self.device)
        self.state.index_fill_(0, slots, 0)
        self.frame_index.index_fill_(0, slots, 0)

    @torch.no_grad()
    def step(self, slots: Tensor, frames: Tensor, end_frames: Tensor) -> Tensor:
        """One frame per row -> float32 audio [B, 2048].

        slots [B] int64 (distinct, except the scratch slot); frames [B, 7] int64 per-position
        codes (any valid code in a flush step); end_frames [B] int64: the stream's number of
        real frames, or ``OPEN_END_FRAMES`` while open. Row b's output holds the samples at
        ``[c * 2048 - D, (c + 1) * 2048 - D)``, c = the slot's frame counter before the call.
        """
        end = end_frames.clamp(max=OPEN_END_FRAMES)  # [B]
        c = self.frame_index.index_select(0, slots)  # [B]
        self.frame_index.index_copy_(0, slots, c + 1)
        st = self.state.index_select(0, slots)  # [B, state]
        if self._nwc is not None:
            if self.is_compiled:
                audio, new_st = self._compiled_forward(st, c, end, frames)
            else:
                audio, new_st = self._nwc.forward(st, c, end, frames)
            self.state.index_copy_(0, slots, new_st)
            return audio
        views = self._layout.views(st)
        masks = self._masks(c, end)

        z = (self._tables[0][frames[:, self._code_idx[0]]]
             + self._tables[1][frames[:, self._code_idx[1]]]
             + self._tables[2][frames[:, self._code_idx[2]]])  # [B, 4, 768]
        # ((0 + z0) + z1) + z2 in the package; 0 + z0 is exact.
        x = z.transpose(1, 2)  # [B, 768, 4]
        x = self._conv(x, views[self._stem_state], self._stem[0], masks[self.rates[0], 0])
        x = F.conv1d(x, self._stem[1].weight, self._stem[1].bias)  # [B, 1024, 4]
        for i, (b, out_delay) in enumerate(self._blocks):
            x = self._block(b, x, views, masks, c, self.rates[i], self.rates[i + 1], out_delay)
        x = self._conv(_snake(x, self._head_alpha), views[self._head_state], self._head_conv,
                       masks[self.rates[-1], self._head_in_delay])
        self.state.index_copy_(0, slots, st)
        return torch.tanh(x)[:, 0].float()  # [B, 2048]

    def _block(self, b: _Block, x: Tensor, views: list[Tensor], masks: dict[tuple[int, int], Tensor],
               c: Tensor, r_in: int, r_out: int, out_delay: int) -> Tensor:
        y = _snake(x, b.alpha) * masks[r_in, b.in_delay]  # [B, C, n]
        prev = views[b.up_state]  # [B, C, 1]
        full = torch.cat((prev, y), dim=2)  # [B, C, n + 1]
        prev.copy_(full[:, :, -1:])
        s = b.stride
        n = y.shape[2]
        x = F.conv_transpose1d(full, b.up.weight, b.up.bias, stride=s)[:, :, s:(n + 1) * s]  # [B, C/2, n*s]
        if self.has_noise:
            pos = c[:, None] * r_out - out_delay + self._aranges[r_out]  # [B, n*s]
            noise = b.noise_table[pos % b.noise_table.numel()][:, None].to(x.dtype)  # [B, 1, n*s]
            x = x + noise * F.conv1d(x, b.noise_weight)
        for u in b.units:
            y = self._conv(_snake(x, u.alpha1), views[u.conv_state], u.conv, masks[r_out, u.in_delay])
            y = F.conv1d(_snake(y, u.alpha2), u.pointwise.weight, u.pointwise.bias)
            x = _add_delayed(y, x, views[u.skip_state])
        return x

    @staticmethod
    def _conv(x: Tensor, state: Tensor, conv: _Conv, mask: Tensor) -> Tensor:
        """Streamed 'same' conv of the new inputs x [B, C, n] (mask [B, 1, n]: inside [0, N))."""
        b, ch, n = x.shape
        ctx = state.shape[2]
        full = x.new_empty(b, ch, ctx + n)  # [B, C, context + n]
        full[:, :, :ctx] = state
        torch.mul(x, mask, out=full[:, :, ctx:])  # masked, no extra copy
        state.copy_(full[:, :, n:])
        return F.conv1d(full, conv.weight, conv.bias, dilation=conv.dilation, groups=conv.groups)

    def _masks(self, c: Tensor, end: Tensor) -> dict[tuple[int, int], Tensor]:
        """(rate, delay) -> [B, 1, n]: 1 where the input position c * rate - delay + t is in [0, N)."""
        return {k: m[:, None] for k, m in _masks(self, c, end).items()}


def _masks(snac: StreamingSnac, c: Tensor, end: Tensor) -> dict[tuple[int, int], Tensor]:
    """(rate, delay) -> [B, n]: 1 where the input position c * rate - delay + t is in [0, N)."""
    out = {}
    for rate, delays in snac._mask_delays.items():
        pos = (c * rate)[:, None, None] - snac._mask_delay_t[rate] + snac._aranges[rate]  # [B, k, n]
        keep = ((pos >= 0) & (pos < (end * rate)[:, None, None])).to(snac.dtype)
        for j, d in enumerate(delays):
            out[rate, d] = keep[:, j]
    return out


def _add_delayed(y: Tensor, x: Tensor, line: Tensor) -> Tensor:
    """y + (x delayed by the delay line's length L); y [B, C, n] is overwritten, line updated."""
    n, delay = x.shape[2], line.shape[2]
    if n < delay:  # not with SNAC 24 kHz's rates (n >= 32 > 27)
        full = torch.cat((line, x), dim=2)  # [B, C, L + n]
        line.copy_(full[:, :, n:])
        return y.add_(full[:, :, :n])
    y[:, :, :delay] += line
    y[:, :, delay:] += x[:, :, :n - delay]
    line.copy_(x[:, :, n - delay:])
    return y


@dataclass
class _Unit:
    alpha1: tuple[Tensor, Tensor]
    conv: _Conv
    alpha2: tuple[Tensor, Tensor]
    pointwise: _Conv
    in_delay: int
    conv_state: int
    skip_state: int


@dataclass
class _Block:
    alpha: tuple[Tensor, Tensor]
    up: _Conv
    stride: int
    up_state: int
    in_delay: int
    noise_weight: Tensor
    noise_table: Tensor
    units: list[_Unit]


class StreamCursor:
    """Host-side bookkeeping for one stream on a ``StreamingSnac`` slot (plain ints).

    Per device step for this stream call ``push()`` (the step carries a real frame) or
    ``flush()`` (a flush step after ``finish()``); each returns ``(lo, hi)``: emit
    ``audio[lo:hi]`` of that step's 2048 samples (``(0, 0)`` when nothing). Pass
    ``end_frames`` with the step.

    A stream may hand out its first samples some other way (e.g. ``StreamingDecoder``'s
    approximate fast start) while its slot is fed the same frames: ``skip_to(n)`` keeps the
    cursor from emitting samples below ``n``.
    """

    __slots__ = ("delay_samples", "num_frames", "num_steps", "is_finished", "skip_upto")

    def __init__(self, delay_samples: int) -> None:
        if delay_samples < 0:
            raise ValueError(f"delay_samples must be >= 0, got {delay_samples}")
        self.delay_samples = delay_samples
        self.num_frames = 0  # real frames pushed
        self.num_steps = 0  # device steps made (= the slot's frame counter)
        self.is_finished = False
        self.skip_upto = 0  # samples below this were emitted elsewhere

    @property
    def num_emitted(self) -> int:
        """Samples out so far (through this cursor or skipped)."""
        done = min(self.num_steps * SAMPLES_PER_FRAME - self.delay_samples, self._end_sample())
        return max(0, done, self.skip_upto)

    def _end_sample(self) -> int:
        return self.num_frames * SAMPLES_PER_FRAME if self.is_finished else 1 << 62

    def skip_to(self, num_samples: int) -> None:
        """Samples ``[0, num_samples)`` went out elsewhere: never emit them here."""
        self.skip_upto = max(self.skip_upto, num_samples)

    @property
    def end_frames(self) -> int:
        """The ``end_frames`` value for this stream's next step."""
        return self.num_frames if self.is_finished else OPEN_END_FRAMES

    @property
    def num_flush_steps_left(self) -> int:
        """Flush steps still needed before every real sample is out (0 while open)."""
        if not self.is_finished or self.num_frames == 0:
            return 0
        total = -(-(self.num_frames * SAMPLES_PER_FRAME + self.delay_samples) // SAMPLES_PER_FRAME)
        return max(0, total - self.num_steps)

    @property
    def is_done(self) -> bool:
        return self.is_finished and self.num_flush_steps_left == 0

    def push(self) -> tuple[int, int]:
        """A step carrying the next real frame: the range of its output to emit."""
        if self.is_finished:
            raise ValueError("push after finish")
        self.num_frames += 1
        return self._advance()

    def finish(self) -> None:
        """No more real frames (idempotent); then call ``flush`` ``num_flush_steps_left`` times."""
        self.is_finished = True

    def flush(self) -> tuple[int, int]:
        """A flush step (frame codes ignored): the range of its output to emit."""
        if not self.is_finished:
            raise ValueError("flush before finish")
        if self.num_flush_steps_left == 0:
            raise ValueError("no flush step left")
        return self._advance()

    def _advance(self) -> tuple[int, int]:
        start = self.num_steps * SAMPLES_PER_FRAME - self.delay_samples
        self.num_steps += 1
        stop = min(start + SAMPLES_PER_FRAME, self._end_sample())
        lo, hi = max(0, -start, self.skip_upto - start), stop - start
        return (lo, hi) if lo < hi else (0, 0)

