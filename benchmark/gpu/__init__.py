"""The engine's GPU tools, each run as ``python -m benchmark.gpu.NAME`` (see benchmark/gpu/README.md)."""
