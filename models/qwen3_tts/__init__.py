"""Qwen3-TTS (12 Hz): talker, code predictor, streaming codec, speaker encoder, prompts."""
