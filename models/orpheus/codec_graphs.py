"""A CUDA-graph ``decode_fn`` for ``OrpheusProgram``: batched SNAC window decodes replayed.

Windows are padded to the next batch bucket (padding rows fully masked) and batches beyond the
largest bucket are split; eager vs graph cost: docs/orpheus.md, "Codec and streaming".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from engine.llm.cuda_graphs import DEFAULT_CODEC_BUCKETS, BatchGraphs
from engine.llm.host_copy import start_host_copy

__all__ = ["make_graph_decode_fn"]


def make_graph_decode_fn(
    decoder: Any,
    *,
    window_frames: int | None = None,
    buckets: Sequence[int] = DEFAULT_CODEC_BUCKETS,
    progress: bool = True,
) -> Callable[[Sequence[Any]], list[np.ndarray]]:
    """Capture ``decoder.decode_windows`` (a ``SnacDecoder`` on a CUDA device) per bucket and
    return ``decode_fn(requests) -> [new samples per request]`` (``WindowRequest`` s).

    Requests whose window is not ``window_frames`` long fall back to the eager batched decode.
    """
    from models.orpheus import codec as codec_mod
    from models.orpheus.tokens import frames_to_codes

    w = window_frames or codec_mod.DEFAULT_WINDOW_FRAMES
    device = decoder.noise_table_0.device
    i64 = torch.int64
    specs = [((w,), i64), ((2 * w,), i64), ((4 * w,), i64), ((), i64), ((), i64), ((), i64)]
    graphs = BatchGraphs(decoder.decode_windows, specs, buckets=buckets, device=device)
    graphs.capture(progress=progress, desc="codec graphs")
    largest = graphs.max_batch_size

    def launch(requests: Sequence[Any]) -> Callable[[], list[np.ndarray]]:
        """Start the replays and their copies to pinned host memory; the returned call waits."""
        if not requests:
            return lambda: []
        if any(r.frames.shape[0] != w for r in requests):
            done = codec_mod.decode_requests(decoder, requests)
            return lambda: done
        pending = []
        for i in range(0, len(requests), largest):
            chunk = requests[i : i + largest]
            frames = torch.stack([r.frames for r in chunk]).to(device, non_blocking=True)  # [B, W, 7]
            c0, c1, c2 = frames_to_codes(frames)
            aux = torch.tensor([[r.start_frame, r.valid_from, r.valid_to] for r in chunk], dtype=i64)
            aux = aux.to(device, non_blocking=True)  # [B, 3]
            (audio,) = graphs.run(c0, c1, c2, aux[:, 0], aux[:, 1], aux[:, 2])  # [B, W*2048]
            pending.append((chunk, start_host_copy(audio)))  # before a later replay overwrites it

        def collect() -> list[np.ndarray]:
            return [host[j, r.emit_from : r.emit_to].numpy() for chunk, wait in pending
                    for host in (wait(),) for j, r in enumerate(chunk)]

        return collect

    def decode(requests: Sequence[Any]) -> list[np.ndarray]:
        return launch(requests)()

    decode.launch = launch  # type: ignore[attr-defined]  (OrpheusProgram runs it asynchronously)
    return decode
