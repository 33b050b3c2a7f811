"""Qwen3-TTS (12 Hz): talker, code predictor, streaming codec, speaker encoder, prompts, loader.

The model-facing API a program uses (shapes per call; ``B`` decode rows, ``T`` flattened tokens):

- ``loader.load_qwen3_tts(path | hub id | preset, load_format="auto" | "dummy")`` ->
  ``Loaded(model, codec, tokenizer, config)``; ``model.talker`` is a ``talker.Talker``.
- Prompt rows: ``prompt.build_prompt(config, text_ids, role_ids=..., language=, speaker=,
  xvector=, instruct_ids=, dual_track=True)`` -> ``Prompt(packed, text_track, xvector_rows,
  eos_pending)``; ``packed`` holds one int64 per position, ``talker.pack(text_id, codec)`` =
  ``text_id << 12 | codec`` with ``codec`` a codec id, ``NO_CODEC`` (4095) or ``XVECTOR`` (4094).
  ``talker.embed_prompt(packed [T], xvectors [T, H] | None) -> [T, H]``.
- Decode rows: the row's id is its next text-track token (``Prompt.text_track``, then
  ``tts_eos`` if ``eos_pending``, then ``tts_pad``); ``talker.embed_decode_slots(text_ids [B],
  slots [B], last_codes [S, 16]) -> [B, H]``.
- Backbone: ``talker(embeds [T, H], positions [T], attn) -> hidden [T, H]`` with
  ``attn(layer, q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D]) -> [T, Hq, D]`` (RoPE applied).
- Frame: ``code_predictor.decode_frame(talker, hidden [B, H], sample, allowed=code0_mask(cfg),
  eos_ok [B], slots [B], last_codes [S, 16]) -> codes [B, 16]``; ``sample(logits [B, V], salt)``
  with salt k for codebook k; stop when ``codes[:, 0] == codec_eos_token_id``.
- Audio: ``codec.CodecStream(codec, max_slots)``: ``reset(slots)``, ``step(slots [N], codes
  [N, 16]) -> pcm [N, 1920]`` (``scratch_slot`` for padding rows; ``delay_samples == 0``).
- Cloning: ``model.speaker_encoder.embed(wav_24k [S]) -> x-vector [H]`` (Base checkpoints).
- Streamed text: ``prompt.TextStream(tokenizer)``: ``push(text) -> ids``, ``end() -> ids``.
"""
