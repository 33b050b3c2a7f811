"""The state machine of ``models.kyutai_tts.machine`` on the device, for a batch of slots: it runs
inside the step, between the text sample and the depth transformer, elementwise per row over
per-slot tensors (docs/models/kyutai_tts.md, "The state machine").
"""

from __future__ import annotations

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
        """Entries ``first_entry ..`` of the slot's text (their words numbered from ``first_word``);
        ``totals`` = (entries, words) once the text has ended. Call between steps."""
        w = first_word
        ew, ep, rows_w, toks, lens = [], [], [], [], []
        for e in entries:
            if len(e.tokens) > self.WORD_TOKENS:
                raise ValueError(f"a word of {len(e.tokens)} tokens (at most {self.WORD_TOKENS}); split it first")
            ep.append(e.padding)
            if e.tokens:
                ew.append(w)
                rows_w.append(w % self.WORDS)
                toks.append(list(e.tokens) + [PAD] * (self.WORD_TOKENS - len(e.tokens)))
                lens.append(len(e.tokens))
                w += 1
            else:
                ew.append(-1)
        dev = self.entry_word.device

        def put(values: list) -> Tensor:  # no host sync: the copy is queued behind the step in flight
            return torch.tensor(values, dtype=torch.int64).to(dev, non_blocking=True)

        if entries:
            idx = put([(first_entry + i) % self.ENTRIES for i in range(len(entries))])
            self.entry_word[slot].index_copy_(0, idx, put(ew))
            self.entry_pad[slot].index_copy_(0, idx, put(ep))
        if rows_w:
            widx = put(rows_w)
            self.word_tok[slot].index_copy_(0, widx, put(toks))
            self.word_len[slot].index_copy_(0, widx, put(lens))
        n_e, n_w = totals if totals is not None else (UNBOUNDED, UNBOUNDED)
        self.num_entries[slot] = n_e
        self.num_words[slot] = n_w

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
