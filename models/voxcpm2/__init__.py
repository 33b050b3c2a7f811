"""VoxCPM2: MiniCPM4 backbone + residual acoustic LM, a local flow-matching DiT making one patch of
latents per step, a stop head, and a 48 kHz AudioVAE with a streaming decoder. The API a program
uses and the design: docs/models/voxcpm2.md.
"""
