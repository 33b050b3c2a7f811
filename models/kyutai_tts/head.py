"""``KyutaiHead``: the runtime's token head for Kyutai TTS (one whole frame per row, in the step).

A row's tokens are ``[sampled text token or STOP, the machine's text output, codebooks 0 ..
n_q - 1 as generated at this step]``; acoustic codebooks come two steps after codebook 0 and
the program undelays them (docs/models/kyutai_tts.md, "The head").
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import torch
from torch import Tensor

from engine.llm.sampler import RowSettings, Sampler, gumbel_noise, gumbel_noise_salts
from engine.llm.token_head import RowInputs
from models.kyutai_tts.depformer import GREEDY, PLAIN, AudioSampling, FrameFns, decode_frame
from models.kyutai_tts.device_machine import DeviceMachine
from models.kyutai_tts.lm import KyutaiLM, SlotInputs, as_traced
from models.kyutai_tts.machine import PAD
from models.kyutai_tts.sampling import top_k_draw

__all__ = ["GEMMS", "SAMPLINGS", "KyutaiHead", "STOP", "finish_frame", "sample_top_k"]

STOP = -2  # the first column's value on a row that ends its sequence
GEMMS = ("torch", "triton", "triton-attend")  # ``kyutai_depth_gemm``'s values
SAMPLINGS = ("torch", "triton", "triton-select")  # ``kyutai_sampling``'s


def sample_top_k(logits: Tensor, k: int, rs: RowSettings, noise: Tensor | None, top_p: Tensor, *,
                 all_greedy: bool = False) -> Tensor:
    """One sample per row among its ``k`` largest logits (a constant of the model: Kyutai's 25
    for text, 250 for audio), with top-p over those ``k`` renormalised (``top_p`` [B, 1], inf
    for none): logits [B, V] (any float dtype; scaled in float32), ``noise`` the row's Gumbel
    noise [B, V] (keyed by column, as the runtime's sampler draws it) and **zero on greedy
    rows** (``rs.is_greedy``), which then take their largest logit -> ids [B].

    The runtime's sampler takes a per-row top-k, so it sorts every column and, with top-p,
    scatters the sorted decision back (about 27 kernels a sample, 25 samples a frame); with a
    constant k the ``k`` largest are enough (10). Among the kept columns the sample is the
    same argmax of scaled logits plus noise; only ties with the k-th value may be kept
    differently (the runtime's sampler keeps them all, ``torch.topk`` one of them, as moshi's
    ``sample_top_k``)."""
    if all_greedy or noise is None:
        return logits.argmax(dim=-1)
    return top_k_draw(logits, k, rs.divisor, noise, top_p)


def _triton_kernel(setting: str, value: str, torch_name: str, device: torch.device, module: str,
                   name: str) -> Callable | None:
    """A setting's Triton kernel (``value`` "triton": ``models.kyutai_tts.<module>.<name>``, on
    CUDA or in Triton's CPU interpreter), None for its torch form (``torch_name``)."""
    if value == torch_name:
        return None
    if value != "triton":
        raise ValueError(f"{setting} must be {torch_name} or triton, got {value!r}")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{setting}=triton needs a CUDA device (its kernel is Triton's)")
    import importlib

    return getattr(importlib.import_module(f"models.kyutai_tts.{module}"), name)


def finish_frame(codes: Tensor, text_out: Tensor, sampled: Tensor, stop: Tensor, steps: Tensor, rows: Tensor,
                 keep: Tensor, silent_until: Tensor, frame_in: Tensor) -> Tensor:
    """A step's last elementwise work: codes [B, n] silenced where not yet due (``silent_until``
    [1, n]), the frame (the machine's text output and the codes) written to the rows' slots of
    ``frame_in`` where ``keep``, and the row's tokens returned: [STOP or the sampled text token,
    the frame] [B, 2 + n]."""
    n = codes.shape[1]
    codes = torch.where(steps[:, None] < silent_until, -1, codes)
    frame = torch.cat((text_out[:, None], codes), dim=1)  # [B, 1 + n]
    cols = frame_in[:, : 1 + n]
    cols.index_copy_(0, rows, torch.where(keep[:, None], frame, cols.index_select(0, rows)))
    first = torch.where(stop, STOP, sampled)
    return torch.cat((first[:, None], frame), dim=1)


class KyutaiHead:
    def __init__(self, lm: KyutaiLM, slots: SlotInputs, machine: DeviceMachine, *, padding_bonus: float = 0.0,
                 compile: bool = False, compile_backend: str | Callable = "inductor",
                 attention: str = "sdpa", sampling: str = "torch", gemm: str = "torch") -> None:
        """``compile``: the depth transformer's fused pieces through ``torch.compile`` (dynamic
        batch; ``compile_backend``: tests trace them without code generation). ``attention``:
        its per-codebook attention as torch's ("sdpa") or one Triton kernel ("triton": CUDA, or
        Triton's CPU interpreter); ``sampling``: each codebook's top-k draw as torch's
        (``sampling.top_k_draw``) or one Triton kernel (``draw_triton``: "triton" sorts a row,
        "triton-select" finds its k kept by bisection where it has no top-p), likewise; ``gemm``: its
        layers' matmuls as torch's ("torch") or with their norms, silu-mul and residual sums fused
        in (``gemm_triton``: "triton"; "triton-attend": the queries, keys and values and the
        attention one kernel too), likewise."""
        cfg = lm.config
        self.lm, self.slots, self.machine = lm, slots, machine
        self.n_q = lm.num_active
        self.num_columns = 2 + self.n_q
        self.padding_bonus = padding_bonus
        self.top_k_text, self.top_k_audio = cfg.tts.top_k_text, cfg.tts.top_k_audio
        self.tail = cfg.delay_steps + cfg.tts.final_padding
        dev = slots.frame_in.device
        self.silent_until = (cfg.delay_steps + torch.tensor(cfg.lm.delays[1:1 + self.n_q], device=dev))[None]  # [1, n_q]
        # Steps before ``first_audio_step`` make no codes at all (every codebook is still delayed):
        # variant 1 skips the depth transformer (the text stream alone). Steps before
        # ``first_acoustic_step`` make codebook 0 only: variant 2 runs the depth transformer for it
        # alone. The codes they leave out are discarded by the full step too.
        self.first_audio_step = int(self.silent_until.min())
        self.first_acoustic_step = int(self.silent_until[:, 1:].min()) if self.n_q > 1 else 1 << 62
        # Rows before it run a cheaper variant: the scheduler may give them light steps of their own.
        self.light_until_step = self.first_acoustic_step if self.n_q > 1 else self.first_audio_step
        self.sampler = Sampler()
        device = slots.frame_in.device
        attend = _triton_kernel("kyutai_depth_attention", attention, "sdpa", device, "attend_triton", "attend_codebook")
        if sampling not in SAMPLINGS:
            raise ValueError(f"kyutai_sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")
        draw = _triton_kernel("kyutai_sampling", "torch" if sampling == "torch" else "triton", "torch", device,
                              "draw_triton", "top_k_select_triton" if sampling == "triton-select" else "top_k_draw_triton")
        if gemm not in GEMMS:
            raise ValueError(f"kyutai_depth_gemm must be one of {', '.join(GEMMS)}, got {gemm!r}")
        gemms = _triton_kernel("kyutai_depth_gemm", "torch" if gemm == "torch" else "triton", "torch", device,
                               "gemm_triton", "DEPTH_GEMMS_ATTEND" if gemm == "triton-attend" else "DEPTH_GEMMS")
        self.triton_draw = draw  # (the text's draw too)
        if compile:
            self.fns = FrameFns.compiled(compile_backend, attend, draw, gemms)
        else:
            self.fns = PLAIN._replace(attend=attend or PLAIN.attend, draw=draw or PLAIN.draw, gemms=gemms)
        # The step's other elementwise work, compiled with the pieces: the Gumbel noise (a hash
        # of some 30 integer kernels a draw) and the state machine's step (some 100), each a few.
        self._noise, self._noise_salts, self._machine_step = gumbel_noise, gumbel_noise_salts, machine.step
        self._finish = finish_frame
        if compile:
            def wrap(f: Callable) -> Callable:
                return torch.compile(f, dynamic=True, fullgraph=True, backend=compile_backend)

            self._noise, self._noise_salts, self._machine_step = wrap(gumbel_noise), wrap(gumbel_noise_salts), wrap(machine.step)
            self._finish = wrap(finish_frame)
        self._compiled = compile
        self._frozen = False  # (``warm_compiled``)
        self.frozen_stance = "eager_on_recompile"  # (tests: "fail_on_recompile")

    # Variants 1 (text only) and 2 (codebook 0 only), for the first steps of a turn, captured up
    # to this many rows: they shorten the first audio of a stream that starts alone or nearly
    # (docs/models/kyutai_tts.md, "Time to first audio").
    variants = (16, 16)

    def warm_compiled(self) -> None:
        """Compile the depth transformer's pieces now, for two or more rows (dynamic) and for one,
        sampled (the captured steps always sample: greedy rows with zero noise); after this a
        call it was not compiled for (an eager step whose rows are all greedy) runs eagerly
        rather than compiling again in the middle of serving. No-op without ``compile``."""
        if not self._compiled or self._frozen:
            return
        lm, dev = self.lm, self.slots.frame_in.device
        dtype = next(lm.parameters()).dtype
        card = lm.config.lm.card
        from torch.fx.experimental import _config as fx_config

        # (no duck sizing: it would tie the batch to any other dimension of the same size at the
        # trace, and compile again for every other batch)
        with torch.inference_mode(), fx_config.patch(use_duck_shape=False):  # (as the runtime's steps)
            for b in (2, 1):
                sampling = AudioSampling(self.top_k_audio or card, torch.ones(b, 1, device=dev),
                                         torch.zeros(self.n_q, b, card, device=dev),
                                         torch.full((b, 1), float("inf"), device=dev))
                hidden = torch.zeros(b, lm.config.lm.dim, dtype=dtype, device=dev)
                decode_frame(lm, hidden, torch.zeros(b, dtype=torch.int64, device=dev), sampling, self.n_q, self.fns)
                i64 = dict(dtype=torch.int64, device=dev)
                seeds, steps = torch.zeros(b, **i64), torch.zeros(b, **i64)
                self._noise(seeds, steps, lm.config.lm.text_card, salt=0)
                for n in sorted({self.n_q, 1}):  # (the whole frame; variant 2's codebook 0)
                    self._noise_salts(seeds, steps, card, range(1, 1 + n))
                scratch = torch.full((b,), self.machine.scratch_row, **i64)  # (the padding row: no real slot's state)
                no = torch.zeros(b, dtype=torch.bool, device=dev)  # (keep nothing: no state changes)
                text = self._machine_step(scratch, torch.zeros(b, **i64), steps, no)
                # (distinct tensors: one passed twice would trace for aliased inputs)
                self._finish(torch.zeros(b, self.n_q, **i64), text, torch.zeros(b, **i64), torch.zeros_like(no), steps,
                             scratch, no, self.silent_until, self.slots.frame_in)
        self._frozen = True

    def _decode(self, hidden: Tensor, text_out: Tensor, sampling: AudioSampling, n: int) -> Tensor:
        return decode_frame(self.lm, hidden, text_out, sampling, n, self.fns)

    def variant(self, steps: Tensor) -> int:
        """The step variant for decode rows at ``steps``: 1 while no row makes a code yet, 2
        while no row makes more than codebook 0, else 0 (the whole frame)."""
        if steps.numel() == 0:
            return 0
        last = int(steps.max())
        return 1 if last < self.first_audio_step else 2 if last < self.first_acoustic_step else 0

    def reset(self, rows: Tensor) -> None:
        self.machine.reset(rows)
        self.slots.frame_in.index_fill_(0, rows, -1)

    def sample(self, hidden: Tensor, r: RowInputs, variant: int = 0) -> tuple[Tensor, Tensor]:
        """hidden [B, dim] -> (tokens int64 [B, 2 + n_q], text logits [B, text_card]);
        ``variant`` 1 (rows before ``first_audio_step``) leaves every codebook silent without the
        depth transformer, 2 (before ``first_acoustic_step``) runs it for codebook 0 only: the
        same tokens as the whole frame, a shorter step."""
        if not self._frozen:
            return self._sample(hidden, r, variant)
        with torch.compiler.set_stance(self.frozen_stance):
            return self._sample(hidden, r, variant)

    def _sample(self, hidden: Tensor, r: RowInputs, variant: int) -> tuple[Tensor, Tensor]:
        if self._compiled:  # (the compiled pieces are traced for dense inference tensors; the
            # runtime's may be columns of one packed tensor, or its graphs' static inputs: copied
            # once here, not a trace for each stride and each kind of tensor; ``as_traced``)
            r = dataclasses.replace(r, seeds=as_traced(r.seeds), steps=as_traced(r.steps), rows=as_traced(r.rows),
                                    keep=as_traced(r.keep))
        ones = torch.ones_like(r.temperature)  # no repetition penalty; shared by every sample
        # Top-p's threshold, none (inf) where top_p is 1: the same for every sample of the step.
        top_p = torch.where(r.top_p < 1, r.top_p, torch.full_like(r.top_p, float("inf")))[:, None]

        def draw(logits: Tensor, settings: RowSettings, salt: int, noise: Tensor | None = None,
                 top_k: int = 0) -> Tensor:
            if top_k > 0:
                if noise is None and not r.all_greedy:
                    noise = self._noise(r.seeds, r.steps, logits.shape[1], salt=salt)
                    noise.masked_fill_(settings.is_greedy[:, None], 0.0)  # (sample_top_k's greedy rows)
                if self.triton_draw is not None and not r.all_greedy and noise is not None:
                    return self.triton_draw(logits, top_k, settings.divisor, noise, top_p)  # (kyutai_sampling)
                return sample_top_k(logits, top_k, settings, noise, top_p, all_greedy=r.all_greedy)
            return self.sampler(logits.float(), settings=settings, repetition_penalty=ones,
                                seeds=r.seeds, steps=r.steps, all_greedy=r.all_greedy, any_top_p=r.any_top_p,
                                salt=salt, noise=noise)

        logits = self.lm.text_logits(hidden)  # [B, text_card]
        if self.padding_bonus:
            logits[:, PAD] += self.padding_bonus
        text_rows = self.sampler.rows(r.temperature, r.top_p)
        sampled = draw(logits, text_rows, 0, top_k=self.top_k_text)  # [B]
        stop = self.machine.stop_due(r.rows, r.steps, self.tail)
        text_out = self._machine_step(r.rows, sampled, r.steps, r.keep)  # [B]

        # The codebooks this variant samples (codebook k with salt k + 1): their Gumbel noise in one
        # draw, not one per codebook (the same noise, bit for bit); none for the text-only variant.
        num_codebooks = self.n_q if variant == 0 else 1 if variant == 2 else 0
        noise = None
        if num_codebooks and not r.all_greedy:
            noise = self._noise_salts(r.seeds, r.steps, self.lm.config.lm.card, range(1, 1 + num_codebooks))
            noise.masked_fill_((r.temperature <= 0)[None, :, None], 0.0)  # greedy rows: no noise
        # (a constant top-k: ``top_k_draw``'s, not a per-row setting of the runtime's sampler; none
        # configured is every column)
        sampling = GREEDY
        if num_codebooks and noise is not None:
            audio = self.sampler.rows(r.temperature, r.top_p)
            sampling = AudioSampling(self.top_k_audio or self.lm.config.lm.card, audio.divisor, noise, top_p)
        if variant == 0:
            codes = self._decode(hidden, text_out, sampling, self.n_q)  # [B, n_q]
        else:  # the codebooks a variant leaves out are silent at its steps
            codes = torch.full((hidden.shape[0], self.n_q), -1, dtype=torch.int64, device=hidden.device)
            if variant == 2:
                codes[:, :1] = self._decode(hidden, text_out, sampling, 1)
        tokens = self._finish(codes, text_out, sampled, stop, r.steps, r.rows, r.keep, self.silent_until, self.slots.frame_in)
        return tokens, logits
