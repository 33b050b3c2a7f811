"""Mimi (Kyutai's neural audio codec: 24 kHz, 12.5 Hz frames of up to 32 codebooks of 2,048).

Shared by Kyutai TTS, CSM and Moshi. The model-facing API (``K`` codebooks, ``T`` frames):

- ``loader.load_mimi(path | None, config=MIMI, load_format="auto" | "dummy") -> codec.Mimi``.
- ``Mimi.encode(wav [B, 1, S]) -> codes [B, num_codebooks, ceil(S / 1920)]`` (``set_num_codebooks``);
  ``Mimi.decode(codes [B, K, T]) -> wav [B, 1, T * 1920]``: moshi's whole-sequence path.
- ``stream.MimiDecodeStream(mimi, max_slots, num_codebooks=K)``: ``reset(slots [N])``,
  ``step(slots [N], codes [N, K]) -> pcm [N, 1920]``, one call per frame, state per slot
  (``scratch_slot`` for padding rows), static shapes per N; ``delay_samples == 0``.
"""
