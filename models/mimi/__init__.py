"""Mimi, Kyutai's neural audio codec (24 kHz, 12.5 Hz frames of up to 32 codebooks of 2,048),
shared by Kyutai TTS, CSM and Moshi. API, checkpoint and design: docs/models/kyutai_tts.md,
"The Mimi codec".
"""
