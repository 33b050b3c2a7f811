"""Qwen3-TTS (12 Hz): talker, code predictor, streaming codec, speaker encoder, prompts, loader.

The API a program uses, with shapes, and the reference facts behind each file:
docs/models/qwen3_tts.md, "The model code".
"""
