"""``voxgate bench``: the latency and capacity benchmark client (docs/benchmark.md)."""
