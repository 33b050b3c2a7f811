"""Kyutai TTS (``kyutai/tts-1.6b-en_fr``, delayed streams): LM, depth transformer, state machine, Mimi.

The model-facing API a program uses (``B`` rows of a step, ``S = max_slots + 1`` slot rows):

- ``loader.load_kyutai_tts(path | hub id | preset, load_format="auto" | "dummy", n_q=) ->
  Loaded(lm, mimi, tokenizer, config)``; ``lm`` is a ``lm.KyutaiLM``, ``mimi`` a
  ``models.mimi.codec.Mimi``; voices: ``loader.load_voice(file) -> [512, 125]``.
- Per-slot state: ``lm.SlotInputs(config, max_slots, bank)`` (``frame_in`` [S, 1 + 32],
  ``cond_sum`` [S, dim], ``voice_row`` [S]) attached with ``lm.attach(slots, n_q)``;
  ``conditioning.VoiceBank(layers, capacity, 625, heads, head_dim)``: each voice's
  cross-attention K/V, filled by ``bank.load(row, lm.condition_provider.cross_source([voice]),
  lm.cross_kv_weights())``; ``cond_sum[slot] = lm.condition_provider.sum_condition(cfg)``.
- Step: ``lm(ids [T], positions [T], attn, token_rows [T]) -> hidden [T, dim]`` (ids unused: the
  inputs are the slot's previous frame, the initial tokens while ``position <= delays[k]``);
  ``attn(layer, q, k, v)`` with RoPE applied, causal over the last ``context`` (500) frames.
- Frame: ``head.KyutaiHead(lm, slots, machine)`` is the runtime ``TokenHead``: ``sample(hidden,
  RowInputs) -> tokens [B, 2 + n_q]`` = [sampled text token or ``head.STOP``, text input fed
  back (``(second + 1) * 8001 + first``), codebooks as generated at this step]; codebook 0 of
  frame t at step t, codebooks 1.. at step t + 2; silent (-1) before frame ``delay_steps`` (16).
- Text: ``text.EntryStream(tokenizer)`` (``push`` / ``flush`` / ``end`` -> ``machine.Entry``);
  ``device_machine.DeviceMachine.write(slot, first_entry, first_word, entries, totals)`` between
  steps; ``machine.HostMachine`` replays the sampled tokens and says when a row may run
  (``ready_to_run(n)``: no pop of an entry whose look-ahead has not arrived).
- Stop: ``end_step`` (the frame that popped past the last entry) + ``delay_steps`` +
  ``final_padding`` (4); audio frames ``delay_steps + 2 .. end_step + delay_steps + 1`` (frames
  ``delay_steps``, ``delay_steps + 1`` decoded, their samples dropped, as the reference does).
"""
