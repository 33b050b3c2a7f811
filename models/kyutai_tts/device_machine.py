"""The state machine of ``models.kyutai_tts.machine`` on the device, for a batch of slots: it runs
inside the step, between the text sample and the depth transformer, elementwise per row over
per-slot tensors (docs/models/kyutai_tts.md, "The state machine").
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from models.kyutai_tts.machine import NEW_WORD, PAD, Entry, MachineParams

__all__ = ["DeviceMachine", "UNBOUNDED"]

UNBOUNDED = 1 << 40


class DeviceMachine:
    ENTRIES = 64  # ring sizes: the host stays well inside them (it writes a few entries ahead)
    WORDS = 64
    WORD_TOKENS = 32  # longest word, in tokens (longer words are split before they get here)

    _COUNTERS = ("remaining", "forced", "next_entry", "q_word", "q_off", "q_len", "la_word", "la_off", "la_limit",
                 "words_popped", "ended", "end_step")

    def __init__(self, params: MachineParams, max_slots: int, device: torch.device | str) -> None:
        self.params = params
        s = max_slots + 1
        self.scratch_row = max_slots  # the padding rows' (its state is never a real slot's)
        i64 = dict(dtype=torch.int64, device=device)
        for name in self._COUNTERS:
            setattr(self, name, torch.zeros(s, **i64))
        self.entry_word = torch.full((s, self.ENTRIES), -1, **i64)
        self.entry_pad = torch.zeros(s, self.ENTRIES, **i64)
        self.word_tok = torch.full((s, self.WORDS, self.WORD_TOKENS), PAD, **i64)
        self.word_len = torch.zeros(s, self.WORDS, **i64)
        self.num_entries = torch.full((s,), UNBOUNDED, **i64)
        self.num_words = torch.full((s,), UNBOUNDED, **i64)
        # staged writes (``stage``): ring place -> (word, padding), word place -> (tokens, length),
        # slot -> totals; None while nothing is staged
        self._staged_entries: dict[int, tuple[int, int]] | None = None
        self._staged_words: dict[int, tuple[list[int], int]] | None = None
        self._staged_totals: dict[int, tuple[int, int]] | None = None
        self.reset(torch.arange(s, device=device))

    @torch.no_grad()
    def reset(self, rows: Tensor) -> None:
        """Fresh counters for new sequences (the rings and totals are the host's: ``write``)."""
        p = self.params
        start = {"remaining": p.initial_padding, "forced": p.initial_padding, "la_word": p.second_stream_ahead,
                 "la_limit": p.second_stream_ahead, "end_step": UNBOUNDED}
        for name in self._COUNTERS:
            getattr(self, name).index_fill_(0, rows, start.get(name, 0))

    # -- host side: entries -------------------------------------------------------------------
    @torch.no_grad()
    def write(self, slot: int, first_entry: int, first_word: int, entries: list[Entry],
              totals: tuple[int, int] | None = None) -> None:
        """``stage`` then ``flush``: the write on the device at once (call between steps)."""
        self.stage(slot, first_entry, first_word, entries, totals)
        self.flush()

    def stage(self, slot: int, first_entry: int, first_word: int, entries: list[Entry],
              totals: tuple[int, int] | None = None) -> None:
        """Entries ``first_entry ..`` of the slot's text (their words numbered from ``first_word``);
        ``totals`` = (entries, words) once the text has ended (else unbounded). Kept on the host
        until ``flush``; a later stage of the same ring place or slot wins, as a later write would."""
        for e in entries:
            if len(e.tokens) > self.WORD_TOKENS:
                raise ValueError(f"a word of {len(e.tokens)} tokens (at most {self.WORD_TOKENS}); split it first")
        if self._staged_entries is None:
            self._staged_entries, self._staged_words, self._staged_totals = {}, {}, {}
        w = first_word
        for i, e in enumerate(entries):
            place = slot * self.ENTRIES + (first_entry + i) % self.ENTRIES
            if e.tokens:
                self._staged_words[slot * self.WORDS + w % self.WORDS] = (
                    list(e.tokens) + [PAD] * (self.WORD_TOKENS - len(e.tokens)), len(e.tokens))
                self._staged_entries[place] = (w, e.padding)
                w += 1
            else:
                self._staged_entries[place] = (-1, e.padding)
        self._staged_totals[slot] = totals if totals is not None else (UNBOUNDED, UNBOUNDED)

    @torch.no_grad()
    def flush(self) -> None:
        """Every staged write onto the device: one host-to-device copy (pinned on CUDA: it is queued
        behind the step in flight, no host sync) and a scatter per table, however many slots wrote.
        Before the next step's launch."""
        if self._staged_entries is None:
            return
        entries, words, totals = self._staged_entries, self._staged_words, self._staged_totals
        self._staged_entries = self._staged_words = self._staged_totals = None
        flat: list[int] = [*entries, *words, *totals]
        for word, pad in entries.values():
            flat += (word, pad)
        for toks, n in words.values():
            flat += toks
            flat.append(n)
        for n_e, n_w in totals.values():
            flat += (n_e, n_w)
        host = torch.from_numpy(np.array(flat, dtype=np.int64))  # (4x faster than torch.tensor on a list)
        dev = self.entry_word.device
        if dev.type == "cuda":
            host = host.pin_memory()
        on = host.to(dev, non_blocking=True)
        ne, nw, nt = len(entries), len(words), len(totals)
        places, word_rows, slots = on[:ne], on[ne:ne + nw], on[ne + nw:ne + nw + nt]
        at = ne + nw + nt
        if ne:
            ent = on[at:at + 2 * ne].view(ne, 2)
            self.entry_word.view(-1).index_copy_(0, places, ent[:, 0])
            self.entry_pad.view(-1).index_copy_(0, places, ent[:, 1])
        at += 2 * ne
        if nw:
            wd = on[at:at + (self.WORD_TOKENS + 1) * nw].view(nw, self.WORD_TOKENS + 1)
            self.word_tok.view(-1, self.WORD_TOKENS).index_copy_(0, word_rows, wd[:, :-1])
            self.word_len.view(-1).index_copy_(0, word_rows, wd[:, -1])
        at += (self.WORD_TOKENS + 1) * nw
        if nt:
            tot = on[at:at + 2 * nt].view(nt, 2)
            self.num_entries.index_copy_(0, slots, tot[:, 0])
            self.num_words.index_copy_(0, slots, tot[:, 1])

    # -- the step -----------------------------------------------------------------------------
    def step(self, rows: Tensor, sampled: Tensor, steps: Tensor, keep: Tensor) -> Tensor:
        """Rows' sampled text tokens [B] at frame ``steps`` [B] -> their next text inputs [B];
        the state of rows with ``keep`` advances."""
        p = self.params
        ahead = p.second_stream_ahead
        E, W, L = self.ENTRIES, self.WORDS, self.WORD_TOKENS
        st = {name: getattr(self, name).index_select(0, rows) for name in self._COUNTERS}
        n_e, n_w = self.num_entries.index_select(0, rows), self.num_words.index_select(0, rows)
        rem, forced, ne = st["remaining"], st["forced"], st["next_entry"]
        qw, qo, ql = st["q_word"], st["q_off"], st["q_len"]
        law, lao, lal, wp = st["la_word"], st["la_off"], st["la_limit"], st["words_popped"]
        ended, end_step = st["ended"].bool(), st["end_step"]

        # Word or pad frame (before popping): the model's choice unless the machine must decide.
        has_q = qo < ql
        word = torch.where(has_q | (forced > 0), False, torch.where(rem <= 0, True, sampled == NEW_WORD))
        has_entry = ne < n_e
        popped = word & has_entry
        e_word = self.entry_word[rows, ne % E]
        e_pad = self.entry_pad[rows, ne % E]
        is_break = e_word < 0
        new_word = popped & ~is_break
        qw = torch.where(new_word, e_word, qw)
        qo = torch.where(new_word, 0, qo)
        ql = torch.where(new_word, self.word_len[rows, e_word.clamp(min=0) % W], ql)
        if ahead:
            lal = torch.where(new_word, torch.minimum(wp + ahead + 1, n_w), lal)
        wp = wp + new_word.long()
        rem = torch.where(new_word, p.max_padding, rem)
        forced = torch.where(popped, e_pad, forced)
        ne = ne + popped.long()
        no_entry = word & ~has_entry
        word = word & ~(popped & is_break)  # a pause entry pads
        word = torch.where(no_entry, ~ended if ahead else torch.zeros_like(word), word)
        end_step = torch.where(no_entry & ~ended, steps, end_step)
        ended = ended | no_entry

        pad = ~word
        rem = torch.where(pad & (rem > 0), rem - 1, rem)
        forced = torch.where(pad & (forced > 0), forced - 1, forced)
        has_q = qo < ql
        q_tok = self.word_tok[rows, qw % W, qo.clamp(max=L - 1)]
        first = torch.where(word, NEW_WORD, torch.where(has_q, q_tok, PAD))
        qo = qo + (pad & has_q).long()
        if ahead:
            is_nw = first == NEW_WORD  # as the reference: a first token of id 0 moves to the second stream
            has_q = qo < ql
            q_tok = self.word_tok[rows, qw % W, qo.clamp(max=L - 1)]
            first = torch.where(is_nw, torch.where(has_q, q_tok, PAD), first)
            qo = qo + (is_nw & has_q).long()
            la_has = law < lal
            la_tok = self.word_tok[rows, law % W, lao.clamp(max=L - 1)]
            second = torch.where(is_nw, NEW_WORD, torch.where(la_has, la_tok, -1))
            adv = ~is_nw & la_has
            lao = lao + adv.long()
            wrap = adv & (lao >= self.word_len[rows, law % W])
            law = torch.where(wrap, law + 1, law)
            lao = torch.where(wrap, 0, lao)
            out = (second + 1) * p.card + first
        else:
            out = first

        new = {"remaining": rem, "forced": forced, "next_entry": ne, "q_word": qw, "q_off": qo, "q_len": ql,
               "la_word": law, "la_off": lao, "la_limit": lal, "words_popped": wp, "ended": ended.long(),
               "end_step": end_step}
        for name, value in new.items():
            buf = getattr(self, name)
            buf.index_copy_(0, rows, torch.where(keep, value, st[name]))
        return out

    def stop_due(self, rows: Tensor, steps: Tensor, tail: int) -> Tensor:
        """bool [B]: the text ended ``tail`` or more frames before frame ``steps`` (the last frame
        the reference generates is ``end_step + tail - 1``)."""
        return self.ended.index_select(0, rows).bool() & (steps >= self.end_step.index_select(0, rows) + tail)
