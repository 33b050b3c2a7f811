"""Orpheus TTS (Llama-3.2-3B emitting SNAC 24 kHz codes) as a program for ``engine.llm``; docs/orpheus.md."""
