"""Kyutai TTS (``kyutai/tts-1.6b-en_fr``, delayed streams): LM, depth transformer, state machine, Mimi.

The API a program uses, with shapes, and the reference facts behind each file:
docs/models/kyutai_tts.md, "The model code".
"""
