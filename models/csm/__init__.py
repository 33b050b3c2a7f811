"""Sesame CSM-1B: a Llama-3.2-1B backbone over Mimi frames (32 codebooks plus text, summed), a
4-layer depth decoder filling codebooks 1-31 inside the step, the conversation's earlier turns
(text plus audio) as its context.

The model-facing API:

- ``loader.load_csm(path | hub id | preset, load_format="auto" | "dummy") -> Loaded`` (model,
  Mimi, tokenizer, config), from transformers' ``CsmForConditionalGeneration`` layout;
- ``build.load(ctx) -> ProgramModel`` for the runtime (``--model csm``, ``csm-tiny``);
- ``prompt.build_prompt(tokenizer, config, turns)``: a conversation as packed ids;
- ``codec.encode_frames(mimi, wav, K)``: context audio to codes, as the reference encodes it.
"""
