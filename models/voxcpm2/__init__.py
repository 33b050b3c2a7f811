"""VoxCPM2: MiniCPM4 backbone + residual acoustic LM, a local flow-matching DiT making one patch of
latents per step, a stop head, and a 48 kHz AudioVAE with a streaming decoder.

The model-facing API a program uses (shapes per call; ``B`` rows, ``T`` flattened tokens, ``S``
slots, ``P`` = 4 frames a patch, ``D`` = 64 latent channels, ``H`` the backbone width):

- ``loader.load_voxcpm2(path | hub id | preset, dtype=, vae_decoder_dtype=, load_format="auto" |
  "dummy", lora=PATH, lora_alpha=)`` -> ``Loaded(model, vae, tokenizer, config, lora_modules)``.
- Paged cache: ``model.num_layers`` = backbone layers + residual layers (one cache; the residual
  LM's layers follow the backbone's), heads / ``head_dim`` from ``config.lm``.
- Per-slot patches: ``model.SlotFeatures(max_slots, max_prompt_patches, P, D)`` (``prompt [S+1,
  F, P, D]``: reference / continuation patches a program writes before the prompt runs;
  ``last [S+1, P, D]``: the last generated patch); set ``model.slot_feats`` to it.
- Step: ``model(ids [T], positions [T], attn, token_rows [T]) -> hidden [T, 2H]`` (backbone |
  residual) with ``attn(layer, q [T, Hq, Dh], k, v [T, Hkv, Dh]) -> [T, Hq, Dh]``; ids are text
  ids, ``model.pack_prompt_patch(j)`` or ``model.LAST_PATCH`` (every decode row).
- Head: ``head.PatchHead(model, slot_feats, max_num_seqs=, max_steps=, ring_patches=)``;
  ``configure(slot, steps=, cfg=, min_len=, cond=, max_len=)`` before a sequence's first step
  (``max_len``: the patch at index ``max_len - 1`` stops; the noise is scaled by the row's
  ``RowInputs.temperature``);
  ``sample(hidden [B, 2H], RowInputs) -> (tokens int64 [B, 2], stop logits [B, 2])``: column 0
  ``LAST_PATCH`` or ``STOP`` (this patch is the last; it is audio), column 1 the patch index;
  the patch goes to ``slot_feats.last[slot]`` and ``head.ring[slot, index % ring_patches]``.
  Noise: ``flow.patch_noise(seeds, patch index)``.
- Prompts: ``prompt.TextTokenizer.ids(text)``, ``prompt.build_prompt(text_ids, ref_patches=,
  prompt_patches=) -> Prompt(ids, ...)``, ``prompt.max_patches(target_ids, cap)``.
- Cloning: ``vae.encode_patches(wav_16k [S], P, left_pad=) -> [N, P, D]`` (float32).
- Audio: ``vae.VAEStream(vae, max_slots, chunk_frames)``: ``reset(slots)``, ``step(slots [N],
  z [N, D, chunk_frames]) -> pcm [N, chunk_frames * 1920]`` at 48 kHz (``scratch_slot`` for
  padding rows; ``delay_samples == 0``); ``z`` of patches [T, P, D] is ``patches.reshape(-1, D).T``.

Served (``--model voxcpm2``): ``build.load(ctx) -> ProgramModel``; ``program.VoxCPM2Program`` (a
segment's prompt, per-request options, ``bind_slot``, ``prepare_voice`` / ``add_voice``);
``audio.ChunkDecoder`` (patches from the head's ring to audio, ``stream_chunk_patches`` at a
time per slot); ``voices`` (WAV reading, resampling, encoding a voice once).
"""
