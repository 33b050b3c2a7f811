"""Benchmarks and measurement tools: ``voxgate bench`` (``bench/``), CPU tools, GPU tools (``gpu/``)."""
