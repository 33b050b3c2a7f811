"""The Kyutai TTS program: words fed as the model asks for them, a frame of codebooks per step,
Mimi decoded once per frame per stream.

How a turn runs (entries, pauses, delays, stop, audio): docs/models/kyutai_tts.md,
"How a turn runs".
"""

from __future__ import annotations

import random
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from engine.backend import BackendInfo, JobError, OptionError
from engine.llm.options import checked_options, number_option, seed_option
from engine.llm.program import Collect
from engine.llm.scheduler import RequestError
from engine.llm.sequence import SamplingParams
from engine.llm.slot_codec import SlotCodec
from models.kyutai_tts.config import KyutaiTTSConfig
from models.kyutai_tts.conditioning import VoiceBank
from models.kyutai_tts.device_machine import DeviceMachine
from models.kyutai_tts.head import STOP
from models.kyutai_tts.lm import KyutaiLM, SlotInputs
from models.kyutai_tts.machine import HostMachine
from models.kyutai_tts.text import EntryStream

__all__ = ["KyutaiProgram", "KyutaiState", "VoiceTable", "DEFAULT_OPTIONS", "find_voices"]

DEFAULT_OPTIONS: dict[str, Any] = {"temperature": 0.6, "top_p": 1.0, "max_tokens": 1500, "cfg": "2.0", "seed": None}
OPTION_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0), "max_tokens": (1, 8192)}
_MAX_ENTRIES_AHEAD = 24  # entries written past the last one the host knows popped (ring: 64)


class VoiceTable:
    """Voice name -> embedding, and the voices loaded in the bank's rows. A row is in use while a
    live turn holds it (held weakly: a turn dropped anywhere frees its row); a free row is
    reused least recently used first."""

    def __init__(self, lm: KyutaiLM, bank: VoiceBank, voices: dict[str, Any]) -> None:
        self.lm, self.bank = lm, bank
        self.voices = voices  # name -> Path of a speaker_wavs file, or a tensor [dim, frames]
        self.row_of: dict[str, int] = {}
        self.name_at: list[str | None] = [None] * bank.capacity
        self.holders: list[weakref.WeakSet] = [weakref.WeakSet() for _ in range(bank.capacity)]
        self._clock = 0
        self._used = [0] * bank.capacity

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.voices))

    def acquire(self, name: str, holder: Any) -> int:
        """The bank row holding ``name`` (loaded now if needed), held by ``holder``."""
        self._clock += 1
        row = self.row_of.get(name)
        if row is None:
            free = [r for r in range(self.bank.capacity) if not self.holders[r]]
            if not free:
                raise RequestError(JobError("capacity", f"{self.bank.capacity} different voices are in use; "
                                            "retry when a turn ends", retryable=True))
            row = min(free, key=lambda r: self._used[r])
            old = self.name_at[row]
            if old is not None:
                del self.row_of[old]
            src = self.voices[name]
            if not isinstance(src, Tensor):
                from models.kyutai_tts.loader import load_voice

                src = load_voice(src)
                self.voices[name] = src
            cp = self.lm.condition_provider
            self.bank.load(row, cp.cross_source([src]), self.lm.cross_kv_weights())
            self.row_of[name], self.name_at[row] = row, name
        self.holders[row].add(holder)
        self._used[row] = self._clock
        return row

    def release(self, row: int, holder: Any) -> None:
        if 0 <= row < len(self.holders):
            self.holders[row].discard(holder)


def find_voices(voice_dir: str | Path, config: KyutaiTTSConfig) -> dict[str, Path]:
    """Voice files under ``voice_dir`` (a ``kyutai/tts-voices`` snapshot): the names are their
    paths without the checkpoint's suffix ``.<sig>@<epoch>.safetensors``, as the reference names them."""
    root = Path(voice_dir).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"voice directory {str(root)!r} does not exist")
    suffix = f".{config.model_id.get('sig')}@{config.model_id.get('epoch')}.safetensors"
    out = {}
    for f in sorted(root.rglob("*" + suffix)):
        out[str(f.relative_to(root))[: -len(suffix)]] = f
    if not out:
        raise FileNotFoundError(f"no voice embeddings (*{suffix}) under {str(root)!r}")
    return out


@dataclass(eq=False)  # identity: the voice table holds turns in weak sets
class KyutaiState:
    """One turn: voice, options, its entries as they arrive, the host's replay, codec progress."""

    voice: str
    cfg: str | None
    stream: EntryStream
    host: HostMachine
    voice_row: int = -1
    slot: int = -1
    written: int = 0  # entries written to the device
    words_written: int = 0
    totals_written: bool = False
    cb0: list[int] = field(default_factory=list)  # codebook 0 of the last frames (undelaying)
    num_decoded: int = 0  # frames through Mimi


class KyutaiProgram:
    """Kyutai TTS over the runtime; see the module docstring."""

    input_streaming = True
    reserve_tokens = 256  # KV tokens at admission (20 s of audio); pages are added as it grows

    def __init__(self, lm: KyutaiLM, config: KyutaiTTSConfig, tokenizer: Any, *, slots: SlotInputs,
                 machine: DeviceMachine, voices: VoiceTable, codec_stream: Any, model_name: str = "kyutai-tts",
                 default_voice: str | None = None, seed_rng: random.Random | None = None) -> None:
        self.lm, self.config, self.tokenizer = lm, config, tokenizer
        self.slots, self.machine, self.voices = slots, machine, voices
        self.n_q = lm.num_active
        self.codec = SlotCodec(codec_stream, num_codes=self.n_q, device=slots.frame_in.device)
        self.params = machine.params
        self.delay = config.delay_steps
        self.max_delay = config.max_delay
        d = config.lm.delays
        if d[1] != 0 or any(x != self.max_delay for x in d[2:]):
            raise ValueError(f"delays {d}: the program undelays codebook 0 at 0 and the others at one delay")
        self._seed_rng = seed_rng or random.Random()
        self.stop_ids = frozenset({STOP})
        self.vocab_ids = None
        self.allowed_table = None
        self._sums: dict[str | None, Tensor] = {}
        self._totals = {"codec_frames": 0}
        names = voices.names()
        if default_voice is None or default_voice not in names:
            default_voice = names[0]
        ranges: dict[str, Any] = {n: {"min": lo, "max": hi, "default": DEFAULT_OPTIONS[n]}
                                  for n, (lo, hi) in OPTION_RANGES.items()}
        ranges["seed"] = {"min": 0, "max": 2**63 - 1, "default": None}
        ranges["cfg"] = {"choices": list(config.condition.cfg_values), "default": DEFAULT_OPTIONS["cfg"]}
        self.info = BackendInfo(model=model_name, voices=names, default_voice=default_voice, sample_rate=24000,
                                options=ranges, input_streaming=True,
                                tokens_per_audio_second=12.5)  # one step per Mimi frame (12.5 Hz)

    # -- jobs -------------------------------------------------------------------------------

    def validate(self, voice: str | None, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        if voice is None or voice == "":
            voice = self.info.default_voice
        if voice not in self.info.voices:
            shown = ", ".join(self.info.voices[:20]) + (" ..." if len(self.info.voices) > 20 else "")
            raise OptionError("unknown_voice", f"unknown voice {voice!r}; voices: {shown}")
        out = checked_options(options, DEFAULT_OPTIONS, self._option)
        return voice, out

    def _option(self, name: str, value: Any) -> Any:
        if name == "seed":
            return seed_option(value)
        if name == "cfg":
            values = self.config.condition.cfg_values
            v = format(float(value), ".1f") if isinstance(value, (int, float)) and not isinstance(value, bool) else value
            if v is not None and v not in values:
                raise OptionError("invalid_option", f"cfg must be one of {', '.join(values)} (or null), got {value!r}")
            return v
        return number_option(name, value, *OPTION_RANGES[name], integer=name == "max_tokens")

    def sampling_params(self, options: dict[str, Any]) -> SamplingParams:
        seed = options.get("seed")
        return SamplingParams(temperature=float(options["temperature"]), top_p=float(options["top_p"]), top_k=0,
                              repetition_penalty=1.0, max_tokens=int(options["max_tokens"]),
                              seed=self._seed_rng.getrandbits(63) if seed is None else int(seed))

    def new_state(self, voice: str, options: dict[str, Any]) -> KyutaiState:
        tts = self.config.tts
        stream = EntryStream(self.tokenizer, multi_speaker=True, padding_between=tts.padding_between,
                             frame_rate=self.config.mimi.frame_rate, max_word_tokens=DeviceMachine.WORD_TOKENS)
        return KyutaiState(voice=voice, cfg=options.get("cfg", DEFAULT_OPTIONS["cfg"]), stream=stream,
                           host=HostMachine(self.params))

    # -- text -------------------------------------------------------------------------------

    def push_text(self, state: KyutaiState, text: str, *, flush: bool, final: bool) -> None:
        if state.host.final:
            return
        entries = state.stream.push(text) if text else []
        if final:
            entries += state.stream.end()
        elif flush:
            entries += state.stream.flush()
        state.host.add(entries, final=final)

    def prompt_ids(self, state: KyutaiState) -> list[int] | None:
        """One position (the initial tokens), once the turn has an entry (a turn that ends with
        none finishes silent); its voice is loaded in the bank now (``RequestError`` when the
        bank's rows are all held by other voices' turns)."""
        if not state.host.entries:
            return None
        if state.voice_row < 0:
            state.voice_row = self.voices.acquire(state.voice, state)
        return [0]

    def next_input(self, state: KyutaiState, position: int) -> int | None:
        host = state.host
        if not host.ready_to_run(position - host.steps + 1):
            return None  # the text runs short of a word the model may ask for: pause
        self._write_entries(state)
        return 0

    def _write_entries(self, state: KyutaiState) -> None:
        """The slot's entries up to ``_MAX_ENTRIES_AHEAD`` past the last pop the host knows of."""
        if state.slot < 0:
            return
        host = state.host
        stop = min(len(host.entries), host.next_entry + _MAX_ENTRIES_AHEAD)
        final = host.final and stop == len(host.entries)
        if state.written >= stop and (state.totals_written or not final):
            return  # (most rows, most steps: nothing new)
        new = host.entries[state.written:stop]
        totals = (len(host.entries), sum(1 for e in host.entries if e.tokens)) if final else None
        self.machine.stage(state.slot, state.written, state.words_written, new, totals)  # (flush_inputs)
        state.written = stop
        state.words_written += sum(1 for e in new if e.tokens)
        state.totals_written = final

    def bind_slot(self, state: KyutaiState, slot: int) -> None:
        state.slot = slot
        state.written = state.words_written = 0
        state.totals_written = False
        s = self.slots
        s.voice_row[slot].fill_(state.voice_row)  # (not ``[slot] = v``: on CUDA that copy waits for the step in flight)
        s.cond_sum[slot].copy_(self._sum(state.cfg))
        self.machine.stage(slot, 0, 0, [], None)
        self._write_entries(state)

    def flush_inputs(self) -> None:
        """The rows' staged text entries onto the device, one copy for the whole step (the
        runtime calls it before each launch)."""
        self.machine.flush()

    def _sum(self, cfg: str | None) -> Tensor:
        if cfg not in self._sums:
            self._sums[cfg] = self.lm.condition_provider.sum_condition(cfg).to(self.slots.cond_sum)
        return self._sums[cfg]

    def allowed_row(self, state: KyutaiState, ahead: int = 0) -> int:
        return 0

    def note_step_interval(self, seconds: float) -> None:
        pass

    def note_due(self, state: KyutaiState, due_in_s: float) -> None:
        pass

    def release(self, state: KyutaiState) -> None:
        self.voices.release(state.voice_row, state)
        state.voice_row = -1

    def totals(self) -> dict[str, int]:
        return dict(self._totals)

    # -- frames -> audio --------------------------------------------------------------------

    def launch_postprocess(self, states: list[KyutaiState], tokens: list[Any]) -> Collect:
        """The host's replay of each row's text token; every frame now complete (frame t at step
        t + 2) through Mimi, one batched call; frames before the audio starts give no samples."""
        rows: list[tuple[int, list[int]]] = []  # (index in states, frame codes) to decode
        keep: list[bool] = []
        fresh: list[int] = []
        for i, (st, row) in enumerate(zip(states, tokens)):
            step = st.host.steps
            fed = st.host.step(int(row[0]))
            if fed != int(row[1]):
                raise RuntimeError(f"Kyutai state machine out of sync at frame {step}: device fed {row[1]}, "
                                   f"host {fed}")
            st.cb0.append(int(row[2]))
            del st.cb0[: -(self.max_delay + 1)]
            t = step - self.max_delay  # the frame completed at this step
            if t < self.delay:
                continue
            frame = [st.cb0[0], *row[3:2 + self.n_q]]  # (the codec's numpy array takes them as they are)
            if st.num_decoded == 0:
                fresh.append(st.slot)
            st.num_decoded += 1
            rows.append((i, frame))
            end = st.host.end_step
            keep.append(t >= self.delay + 2 and (end is None or t <= end + self.delay + 1))
        if not rows:
            return lambda: [None] * len(states)
        self._totals["codec_frames"] += len(rows)
        pcm = self.codec.launch([states[i].slot for i, _ in rows], [f for _, f in rows], fresh, clip=True)

        def collect() -> list[Any]:
            out: list[Any] = [None] * len(states)
            for (i, _), k, p in zip(rows, keep, pcm()):
                if k:
                    out[i] = p
            return out

        return collect

    def launch_finish(self, states: list[KyutaiState]) -> Collect:
        """Mimi is causal: a finished turn has no audio left. Its voice row is released."""
        for st in states:
            self.release(st)
        return lambda: [None] * len(states)
