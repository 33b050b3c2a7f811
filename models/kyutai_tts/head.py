"""``KyutaiHead``: the runtime's token head for Kyutai TTS (one whole frame per row, in the step).

Per row, inside the captured step (``engine.llm.token_head``): the text-stream logits of the
temporal hidden state are sampled (salt 0; top-k ``top_k_text``), the device state machine turns
the sample into the next text input (``DeviceMachine.step``), the depth transformer samples the
frame's ``n_q`` codebooks from that input (salts 1..n_q; top-k ``top_k_audio``), codebooks not yet
due are forced to -1 (codebook k is silent before frame ``delay_steps + delays[1 + k]``, as
moshi's ``TTSModel.generate`` zeroes them), and the frame is written to the slot's
``frame_in`` for the next step's embedding.

A row's tokens (``num_columns = 2 + n_q``): ``[sampled text token, or STOP; the machine's
text output; codebook 0 .. n_q - 1 as generated at this frame]``. Codebook 0 of frame t comes
at step t, the acoustic codebooks (delay 2) at step t + 2: the program undelays them. STOP
replaces the sampled token once the text ended ``delay_steps + final_padding`` frames ago (the
reference's last frame is the one before).
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.llm.sampler import Sampler
from engine.llm.token_head import RowInputs
from models.kyutai_tts.depformer import decode_frame
from models.kyutai_tts.device_machine import DeviceMachine
from models.kyutai_tts.lm import KyutaiLM, SlotInputs
from models.kyutai_tts.machine import PAD

__all__ = ["KyutaiHead", "STOP"]

STOP = -2  # the first column's value on a row that ends its sequence


class KyutaiHead:
    def __init__(self, lm: KyutaiLM, slots: SlotInputs, machine: DeviceMachine, *, padding_bonus: float = 0.0) -> None:
        cfg = lm.config
        self.lm, self.slots, self.machine = lm, slots, machine
        self.n_q = lm.num_active
        self.num_columns = 2 + self.n_q
        self.padding_bonus = padding_bonus
        self.top_k_text, self.top_k_audio = cfg.tts.top_k_text, cfg.tts.top_k_audio
        self.tail = cfg.delay_steps + cfg.tts.final_padding
        dev = slots.frame_in.device
        self.silent_until = (cfg.delay_steps + torch.tensor(cfg.lm.delays[1:1 + self.n_q], device=dev))[None]  # [1, n_q]
        self.sampler = Sampler()

    def reset(self, rows: Tensor) -> None:
        self.machine.reset(rows)
        self.slots.frame_in.index_fill_(0, rows, -1)

    def _sample(self, logits: Tensor, r: RowInputs, top_k: int, salt: int) -> Tensor:
        ones = torch.ones_like(r.temperature)
        k = torch.full_like(r.seeds, top_k) if top_k > 0 else None
        return self.sampler(logits, temperature=r.temperature, top_p=r.top_p, repetition_penalty=ones, seeds=r.seeds,
                            steps=r.steps, all_greedy=r.all_greedy, any_top_p=r.any_top_p, top_k=k, salt=salt)

    def sample(self, hidden: Tensor, r: RowInputs) -> tuple[Tensor, Tensor]:
        """hidden [B, dim] -> (tokens int64 [B, 2 + n_q], text logits [B, text_card])."""
        logits = self.lm.text_logits(hidden)  # [B, text_card]
        if self.padding_bonus:
            logits[:, PAD] += self.padding_bonus
        sampled = self._sample(logits, r, self.top_k_text, 0)  # [B]
        stop = self.machine.stop_due(r.rows, r.steps, self.tail)
        text_out = self.machine.step(r.rows, sampled, r.steps, r.keep)  # [B]

        def sample_audio(audio_logits: Tensor, salt: int) -> Tensor:
            return self._sample(audio_logits, r, self.top_k_audio, salt)

        codes = decode_frame(self.lm, hidden, text_out, sample_audio, self.n_q)  # [B, n_q]
        codes = torch.where(r.steps[:, None] < self.silent_until, -1, codes)
        frame = torch.cat((text_out[:, None], codes), dim=1)  # [B, 1 + n_q]
        fi = self.slots.frame_in
        old = fi.index_select(0, r.rows)[:, : 1 + self.n_q]
        fi[:, : 1 + self.n_q].index_copy_(0, r.rows, torch.where(r.keep[:, None], frame, old))
        first = torch.where(stop, STOP, sampled)
        return torch.cat((first[:, None], frame), dim=1), logits
