"""Helpers for the Kyutai TTS parity tests: the tiny checkpoint's spec, the reference jobs, and a
greedy generation loop over our modules (a uniquely named module)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tests.models.mimi.mimi_fixtures import REF_PYTHON, run_reference  # noqa: F401  (re-exported)

from engine.llm.token_head import RowInputs
from models.kyutai_tts.config import TINY
from models.kyutai_tts.conditioning import VoiceBank
from models.kyutai_tts.device_machine import DeviceMachine
from models.kyutai_tts.head import STOP, KyutaiHead
from models.kyutai_tts.lm import SlotInputs
from models.kyutai_tts.machine import Entry, HostMachine, MachineParams

HERE = Path(__file__).resolve().parent
REF_SCRIPT = HERE / "reference_run.py"
VOICE_FRAMES = TINY.condition.voice_frames  # 10
TEXT_A = "Hello world, this is a small test of speech: it reads (some) words."
TEXT_B = "The quick brown fox jumps over the lazy dog naïve"  # ï is not in the tokenizer: an <unk> piece
TEXT_C = 'We keep <break time="0.4s"/> the audio behind.'

GEN_JOBS = {
    "once32": dict(kind="generate", mode="once", text=TEXT_A, voice="voice_a", cfg=2.0, n_q=32),
    "reveal32": dict(kind="generate", mode="reveal", text=TEXT_A, voice="voice_a", cfg=2.0, n_q=32),
    "once8_nocfg": dict(kind="generate", mode="once", text=TEXT_B, voice="voice_b", cfg=None, n_q=8),
    "once16_break": dict(kind="generate", mode="once", text=TEXT_C, voice="voice_a", cfg=3.5, n_q=16),
    "once8_a": dict(kind="generate", mode="once", text=TEXT_A, voice="voice_a", cfg=2.0, n_q=8),
}
JOBS = {
    **GEN_JOBS,
    "conditions": dict(kind="conditions", voices=["voice_a", "voice_b"], cfg=1.5),
}


def spec() -> dict:
    return {"seed": 0, "config": TINY.to_hf_dict(), "mimi_config": TINY.mimi.to_dict(),
            "vocab_size": TINY.lm.text_card,
            "voices": {"voice_a": [TINY.condition.speaker_dim, VOICE_FRAMES],
                       "voice_b": [TINY.condition.speaker_dim, VOICE_FRAMES]}}


def build_checkpoint(out: Path) -> Path:
    spec_file = out.parent / f"{out.name}_spec.json"
    spec_file.write_text(json.dumps(spec()))
    run_reference(REF_SCRIPT, ["build", str(out), str(spec_file)], timeout_s=600)
    return out


def reference_outputs(root: Path, work: Path) -> dict:
    jobs_file, out = work / "jobs.json", work / "ref_out.pt"
    jobs_file.write_text(json.dumps(JOBS))
    run_reference(REF_SCRIPT, ["run", str(root), str(jobs_file), str(out)], timeout_s=900)
    return torch.load(out)


def load_ours(root: Path, n_q: int = 32):
    from models.kyutai_tts.loader import load_kyutai_tts

    return load_kyutai_tts(root, dtype=torch.float32, n_q=n_q, voice_frames=VOICE_FRAMES)


def voice_file(root: Path, name: str) -> Path:
    """A voice embedding of the tiny checkpoint (named as kyutai/tts-voices names them)."""
    sig = TINY.model_id
    return root / "voices" / f"{name}.{sig['sig']}@{sig['epoch']}.safetensors"


def cfg_value(cfg: float | None) -> str | None:
    return None if cfg is None else format(cfg, ".1f")


class WindowAttention:
    """Dense causal attention over each sequence's last ``window`` positions (the runtime's
    ``attn`` contract, with the window the model needs); one cache per sequence id."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.cache: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.seqs: list[int] = [0]

    def plan(self, seqs: list[int]) -> None:
        """The next step has one token for each of ``seqs`` (in order)."""
        self.seqs = list(seqs)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        outs = []
        for i, seq in enumerate(self.seqs):
            pk, pv = self.cache.get((seq, layer), (k[:0], v[:0]))
            kc, vc = torch.cat((pk, k[i:i + 1]))[-self.window:], torch.cat((pv, v[i:i + 1]))[-self.window:]
            self.cache[(seq, layer)] = (kc, vc)
            scores = torch.einsum("hd,shd->hs", q[i].float(), kc.float()) * q.shape[-1] ** -0.5
            outs.append(torch.einsum("hs,shd->hd", scores.softmax(-1), vc.float()).to(q.dtype))
        return torch.stack(outs)


def greedy_rows(n: int, steps: list[int], rows: list[int]) -> RowInputs:
    z = torch.zeros(n)
    return RowInputs(temperature=z, top_p=torch.ones(n), repetition_penalty=torch.ones(n),
                     seeds=torch.zeros(n, dtype=torch.int64), steps=torch.tensor(steps), rows=torch.tensor(rows),
                     allowed_rows=torch.zeros(n, dtype=torch.int64), keep=torch.ones(n, dtype=torch.bool),
                     all_greedy=True, any_top_p=False)


@dataclass
class Stream:
    """One sequence of the test driver: its slot, its text (entries), what it generated."""

    slot: int
    entries: list[Entry]
    host: HostMachine
    arrive_at: list[int] | None = None  # step before which entry i becomes available (None: all at once)
    written: int = 0
    words_written: int = 0
    rows: list[list[int]] = field(default_factory=list)  # per step: [sampled, text_out, codes...]
    pauses: int = 0
    done: bool = False


class Driver:
    """Our modules in a greedy loop: several streams batched, text revealed over time, pauses."""

    def __init__(self, loaded, *, max_slots: int = 3, bank_rows: int = 2) -> None:
        self.loaded = loaded
        cfg = loaded.config
        lm = loaded.lm
        self.params = MachineParams(card=cfg.text_card_in, second_stream_ahead=cfg.tts.second_stream_ahead,
                                    max_padding=cfg.tts.max_padding, initial_padding=cfg.tts.initial_padding)
        c = cfg.lm
        self.bank = VoiceBank(c.num_layers, bank_rows, cfg.condition.cross_len, c.num_heads, c.head_dim,
                              device="cpu", dtype=torch.float32)
        self.slots = SlotInputs(cfg, max_slots, self.bank, device="cpu", dtype=torch.float32)
        lm.attach(self.slots, cfg.tts.n_q)
        self.machine = DeviceMachine(self.params, max_slots, "cpu")
        self.head = KyutaiHead(lm, self.slots, self.machine)
        self.attn = WindowAttention(c.context)
        self.streams: list[Stream] = []

    def load_voice(self, row: int, voices: list[torch.Tensor]) -> None:
        lm = self.loaded.lm
        self.bank.load(row, lm.condition_provider.cross_source(voices), lm.cross_kv_weights())

    def add(self, slot: int, entries: list[Entry], *, voice_row: int, cfg: str | None,
            arrive_at: list[int] | None = None) -> Stream:
        s = Stream(slot, entries, HostMachine(self.params), arrive_at)
        self.slots.voice_row[slot] = voice_row
        self.slots.cond_sum[slot] = self.loaded.lm.condition_provider.sum_condition(cfg)
        self.head.reset(torch.tensor([slot]))
        self.machine.write(slot, 0, 0, [], None)
        self.streams.append(s)
        return s

    def _deliver(self, s: Stream, step: int) -> None:
        n = len(s.entries) if s.arrive_at is None else sum(1 for a in s.arrive_at if a <= step)
        new = s.entries[s.written:n]
        final = n == len(s.entries)
        if new or (final and not s.host.final):
            s.host.add(new, final=final)
            self.machine.write(s.slot, s.written, s.words_written, new,
                               (len(s.entries), sum(1 for e in s.entries if e.tokens)) if final else None)
            s.written = n
            s.words_written += sum(1 for e in new if e.tokens)

    def run(self, max_steps: int = 400) -> None:
        # Tiny tensors: one thread avoids thread-pool overheads on a loaded 2-core machine.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            self._run(max_steps)
        finally:
            torch.set_num_threads(threads)

    def _run(self, max_steps: int) -> None:
        lm = self.loaded.lm
        step = 0
        while not all(s.done for s in self.streams) and step < 10 * max_steps:
            live = []
            for s in self.streams:
                if s.done:
                    continue
                self._deliver(s, step)
                if s.host.ready_to_run(1):
                    live.append(s)
                else:
                    s.pauses += 1
            step += 1
            if not live:
                continue
            positions = [len(s.rows) for s in live]
            self.attn.plan([s.slot for s in live])
            rows = torch.tensor([s.slot for s in live])
            with torch.no_grad():
                hidden = lm(torch.zeros(len(live), dtype=torch.int64), torch.tensor(positions), self.attn, rows)
                tokens, _ = self.head.sample(hidden, greedy_rows(len(live), positions, [s.slot for s in live]))
            for s, row in zip(live, tokens.tolist()):
                if row[0] == STOP or len(s.rows) >= max_steps:
                    s.done = True
                    continue
                s.rows.append(row)
                s.host.step(row[0])


def frames_of(rows: list[list[int]], n_q: int, max_delay: int = 2) -> torch.Tensor:
    """Per-step rows [sampled, text_out, code_0..] -> undelayed frames [1 + n_q, steps - max_delay]
    in the reference's layout (text, codebook 0 at its step, codebooks 1.. two steps later)."""
    t = torch.tensor(rows)  # [steps, 2 + n_q]
    n = t.shape[0] - max_delay
    text = t[:n, 1]
    cb0 = t[:n, 2]
    rest = t[max_delay:, 3:3 + n_q - 1]
    return torch.cat((text[None], cb0[None], rest.t()), dim=0)
