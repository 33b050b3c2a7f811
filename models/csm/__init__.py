"""Sesame CSM-1B: a Llama-3.2-1B backbone over Mimi frames (32 codebooks plus text, summed), a
4-layer depth decoder filling codebooks 1-31 inside the step, the conversation's earlier turns
(text plus audio) as its context. API and design: docs/models/csm.md.
"""
