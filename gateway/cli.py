"""The ``voxgate`` command: ``voxgate serve`` runs the gateway and its engine; ``voxgate bench``
runs the latency benchmark client."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import ssl
import sys
from dataclasses import fields

from engine.config import DECODE_ATTENTION_KERNELS, EngineConfig
from engine.core import CoreConfig
from gateway.config import GatewayConfig

__all__ = ["main", "build_parser", "configs_from_args"]

log = logging.getLogger("voxgate")


def _csv(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _add_serve_args(sp: argparse.ArgumentParser) -> None:
    g = sp.add_argument_group("network")
    g.add_argument("--host", default=GatewayConfig.host, help="address to bind (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=GatewayConfig.port, help="port; 0 picks a free one")
    sec = sp.add_argument_group("security (docs/security.md)")
    sec.add_argument("--api-key", default=os.environ.get("VOXGATE_API_KEY", ""),
                     help="require this key on /v1/... and /metrics: 'Authorization: Bearer KEY', "
                          "'X-API-Key', 'xi-api-key' or ?api_key= (default: $VOXGATE_API_KEY; none)")
    sec.add_argument("--allowed-origins", type=_csv, default=GatewayConfig.allowed_origins,
                     help="comma-separated browser Origins that may use the WebSocket and change "
                          "state, besides the server's own page ('*': any; requests without an "
                          "Origin, as from agents, always may)")
    sec.add_argument("--allowed-hosts", type=_csv, default=GatewayConfig.allowed_hosts,
                     help="comma-separated Host names the server answers to (bound to loopback, "
                          "loopback names always; elsewhere, unchecked unless given)")
    sec.add_argument("--metrics-public", action="store_true",
                     help="serve /metrics without the API key")
    sec.add_argument("--ssl-certfile", default=GatewayConfig.ssl_certfile,
                     help="TLS: PEM certificate chain; the server then speaks https and wss")
    sec.add_argument("--ssl-keyfile", default=GatewayConfig.ssl_keyfile,
                     help="TLS: its private key (if not in --ssl-certfile)")
    sec.add_argument("--max-connections-per-ip", type=int, default=GatewayConfig.max_connections_per_ip,
                     help="WebSocket connections from one client address; more get 429 (0: no "
                          "limit; behind a proxy every client has the proxy's address)")
    sec.add_argument("--max-streams-per-ip", type=int, default=GatewayConfig.max_streams_per_ip,
                     help="active streams over all of one address's connections; more get "
                          "too_many_streams, retryable (0: no limit)")
    m = sp.add_argument_group("model")
    m.add_argument("--model", default=EngineConfig.model,
                   help="hibari (embedded CPU voice, default), synthetic (test tones), orpheus, "
                        "or a local path / hub id of an Orpheus checkpoint")
    m.add_argument("--device", default=EngineConfig.device, choices=["auto", "cpu", "cuda"])
    m.add_argument("--load-format", default=EngineConfig.load_format, choices=["auto", "dummy"],
                   help="dummy: random weights from the known config, no files (benchmarking)")
    m.add_argument("--dtype", default=EngineConfig.dtype,
                   choices=["auto", "bfloat16", "float16", "float32"])
    m.add_argument("--codec", dest="codec_path", default=None,
                   help="SNAC codec: local dir or hub id (default hubertsiuzdak/snac_24khz)")
    m.add_argument("--gpu-memory-utilization", type=float, default=EngineConfig.gpu_memory_utilization)
    m.add_argument("--max-num-seqs", type=int, default=EngineConfig.max_num_seqs)
    m.add_argument("--max-model-len", type=int, default=EngineConfig.max_model_len)
    m.add_argument("--max-num-decode-seqs", type=int, default=EngineConfig.max_num_decode_seqs,
                   help="decode rows per step, earliest deadlines first; the rest wait a step "
                        "(-1 auto: 384 on CUDA, 448 with --quantization fp8, no cap on the CPU; 0 no cap)")
    m.add_argument("--decode-horizon-s", type=float, default=EngineConfig.decode_horizon_s,
                   help="decode only jobs whose audio is due within this many seconds, so the "
                        "step is short for those that need audio now (-1 auto: 1.0 on CUDA, off "
                        "on the CPU; 0 off)")
    m.add_argument("--decode-fill-seqs", type=int, default=EngineConfig.decode_fill_seqs,
                   help="with a decode horizon, rows decoded anyway, earliest deadlines first "
                        "(-1 auto: 256 on CUDA)")
    m.add_argument("--prefill-wait-s", type=float, default=EngineConfig.prefill_wait_s,
                   help="under load, a new prompt waits up to this long for others to share its "
                        "prefill pass (-1 auto: 0.05 with CUDA graphs; 0 off)")
    m.add_argument("--prefill-batch-seqs", type=int, default=EngineConfig.prefill_batch_seqs,
                   help="prompts that go at once without waiting (-1 auto: 8 with CUDA graphs)")
    m.add_argument("--hold-undue-prompts", default=EngineConfig.hold_undue_prompts, choices=["on", "off"],
                   help="under load, prompts not due within the decode horizon (segments generated "
                        "ahead) wait until due or until a step has room (off: not measured on a GPU)")
    m.add_argument("--async-steps", default=EngineConfig.async_steps, choices=["auto", "on", "off"],
                   help="launch each LM step before the previous step's tokens reach the host, "
                        "rows continuing from them on the device (auto: on with CUDA graphs)")
    m.add_argument("--mixed-graphs", default=EngineConfig.mixed_graphs, choices=["on", "off"],
                   help="a step with decode rows and fresh prompts replays one CUDA graph (one pass "
                        "over the weights) instead of two (off: on an H200 no more streams kept real time)")
    m.add_argument("--async-plan", default=EngineConfig.async_plan, choices=["on", "off"],
                   help="the decode graphs' attention plans send page ids to the GPU without waiting "
                        "for the step in flight (on: engine steps 2-7%% shorter on an H200)")
    m.add_argument("--decode-attention", default=EngineConfig.decode_attention, choices=list(DECODE_ATTENTION_KERNELS),
                   help="FlashInfer's decode kernel in the CUDA graphs: its CUDA-core decode kernel, or "
                        "its tensor-core prefill kernel (cuda-cores: tensor cores were slower at served contexts on an H200)")
    m.add_argument("--ramp-step-samples", type=int, default=EngineConfig.ramp_step_samples,
                   help="Orpheus fast-start ramp: lookahead growth per frame in samples (1024: "
                        "1,024 samples in each of the first 4 frames; 1536: 1024, 512, 512, 1387; "
                        "0 auto: 1024, or 1536 while frames take over 35 ms, on CUDA)")
    m.add_argument("--no-cuda-graphs", dest="enable_cuda_graphs", action="store_false")
    m.add_argument("--kv-cache-dtype", default=EngineConfig.kv_cache_dtype, choices=["auto", "fp8"],
                   help="fp8: KV cache pages in float8_e4m3fn, half the bytes (CUDA, bf16 only; "
                        "see docs/orpheus.md 'fp8 option')")
    m.add_argument("--quantization", default=EngineConfig.quantization, choices=["none", "fp8"],
                   help="fp8: decoder linear weights in fp8 with per-channel scales, row-wise fp8 "
                        "GEMMs (CUDA, compute capability >= 8.9)")
    m.add_argument("--synthetic-fast", dest="synthetic_realtime", action="store_false",
                   help="synthetic model: emit audio as fast as possible instead of at real time")
    m.add_argument("--lookahead-jobs", type=int, default=CoreConfig.lookahead_jobs,
                   help="segments generated ahead of the one being spoken")
    lim = sp.add_argument_group("limits")
    lim.add_argument("--max-streams", type=int, default=CoreConfig.max_streams,
                     help="streams open at once over all connections; more get a retryable "
                          "`capacity` error (set it to the capacity `voxgate bench` measured)")
    for name in ("max_text_chars_per_stream", "max_streams_per_connection", "max_frame_bytes",
                 "max_outbox_bytes", "max_connections"):
        lim.add_argument("--" + name.replace("_", "-"), type=int,
                         default=getattr(GatewayConfig, name))
    lim.add_argument("--idle-timeout-s", type=float, default=GatewayConfig.idle_timeout_s)
    lim.add_argument("--engine-start-timeout-s", type=float,
                     default=GatewayConfig.engine_start_timeout_s)
    lim.add_argument("--drain-timeout-s", type=float, default=GatewayConfig.drain_timeout_s,
                     help="on SIGTERM the server takes no new connections or streams (/health: "
                          "draining, 503) and lets streams in flight finish for this many "
                          "seconds; then the rest end with server_shutdown (retryable), close "
                          "1001. SIGINT (Ctrl-C) stops at once")
    v = sp.add_argument_group("registered voices (POST /v1/voices, models that can clone)")
    v.add_argument("--data-dir", default=GatewayConfig.data_dir,
                   help="where registered voices are kept (default: $XDG_DATA_HOME/voxgate or "
                        "~/.local/share/voxgate; nothing is written until a voice is registered)")
    v.add_argument("--max-voice-upload-bytes", type=int, default=GatewayConfig.max_voice_upload_bytes,
                   help="largest upload, the whole request, in bytes; a larger one gets 413, before "
                        "its body is read when its Content-Length says so (default 10 MiB)")
    v.add_argument("--min-voice-duration-s", type=float, default=GatewayConfig.min_voice_duration_s,
                   help="shortest voice sample accepted, in seconds")
    v.add_argument("--max-voice-duration-s", type=float, default=GatewayConfig.max_voice_duration_s,
                   help="longest voice sample accepted, in seconds (decoding stops there)")
    v.add_argument("--min-voice-rms-dbfs", type=float, default=GatewayConfig.min_voice_rms_dbfs,
                   help="a sample whose RMS level is below this many dB of full scale is refused "
                        "as silent")
    v.add_argument("--max-voice-name-chars", type=int, default=GatewayConfig.max_voice_name_chars,
                   help="longest voice name (letters, digits, spaces and - _ . ' ( ))")
    v.add_argument("--max-voice-transcript-chars", type=int,
                   default=GatewayConfig.max_voice_transcript_chars,
                   help="longest transcript of a voice sample, in characters")
    v.add_argument("--max-voices", type=int, default=GatewayConfig.max_voices,
                   help="voices kept at most; registering more gets 409")
    m.add_argument("--synthetic-cloning", dest="synthetic_cloning", action="store_true",
                   help="synthetic model: accept registered voices (for tests of the voice store)")
    sp.add_argument("--debug-timestamps", action="store_true",
                    help="add engine_t (engine emit time, CLOCK_MONOTONIC) to audio messages")
    sp.add_argument("--log-level", default="INFO",
                    choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the WebSocket gateway and its engine")
    _add_serve_args(serve)
    sub.add_parser("bench", help="the latency benchmark client (voxgate bench --help)",
                   add_help=False)
    return parser


def configs_from_args(args: argparse.Namespace) -> tuple[GatewayConfig, EngineConfig]:
    """Map parsed arguments onto the two process configurations (raises ValueError)."""
    values = vars(args)
    gateway = GatewayConfig(**{f.name: values[f.name] for f in fields(GatewayConfig)
                               if f.name in values})
    core = CoreConfig(lookahead_jobs=args.lookahead_jobs, max_streams=args.max_streams)
    engine = EngineConfig(core=core, **{f.name: values[f.name] for f in fields(EngineConfig)
                                        if f.name in values and f.name != "core"})
    return gateway, engine


async def _serve(gateway_config: GatewayConfig, engine_config: EngineConfig,
                 log_level: str) -> int:
    """Bind, start the engine, serve until a signal: SIGTERM drains (streams in flight may
    finish for ``--drain-timeout-s``), SIGINT (Ctrl-C) or a second signal stops at once."""
    from gateway.engine_client import EngineStartError
    from gateway.server import Gateway

    gateway = Gateway(gateway_config, engine_config, log_level=log_level)
    host, port = gateway_config.host, gateway_config.port
    try:
        await gateway.listen()  # before the engine: a port in use is found in a moment
    except ssl.SSLError as exc:
        print(f"voxgate: error: cannot use the TLS certificate or key: {exc}", file=sys.stderr,
              flush=True)
        await gateway.stop()
        return 1
    except OSError as exc:
        what = (f"read {exc.filename}" if exc.filename else f"listen on {host}:{port}")
        print(f"voxgate: error: cannot {what}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        await gateway.stop()
        return 1
    signals: asyncio.Queue[int] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    print(f"voxgate: starting the engine (model {engine_config.model}) ...", flush=True)
    starting = asyncio.create_task(gateway.start_engine())
    first_signal = asyncio.create_task(signals.get())
    await asyncio.wait({starting, first_signal}, return_when=asyncio.FIRST_COMPLETED)
    if first_signal.done():  # stopped while the model loads
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        print("voxgate: shutting down", flush=True)
        await gateway.stop()
        return 0
    try:
        starting.result()
    except EngineStartError as exc:
        print(f"voxgate: error: {exc}", file=sys.stderr, flush=True)
        first_signal.cancel()
        await gateway.stop()
        return 1
    from engine.gc_heap import freeze_startup_heap

    freeze_startup_heap()  # the gateway's start-up objects: out of every full collection
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    hello = gateway.engine.hello
    if hello is not None and hello.device:
        print(f"voxgate: model {hello.model} on {hello.device}", flush=True)
    http_scheme, ws_scheme = ("https", "wss") if gateway_config.ssl_certfile else ("http", "ws")
    print(f"voxgate: serving on {http_scheme}://{shown}:{gateway.port}/ (demo page); "
          f"WebSocket {ws_scheme}://{shown}:{gateway.port}/v1/stream", flush=True)
    if await first_signal == signal.SIGTERM and gateway_config.drain_timeout_s > 0:
        print(f"voxgate: draining: streams in flight may finish for "
              f"{gateway_config.drain_timeout_s:g} s (--drain-timeout-s)", flush=True)
        drain = asyncio.create_task(gateway.drain(gateway_config.drain_timeout_s))
        second_signal = asyncio.create_task(signals.get())
        await asyncio.wait({drain, second_signal}, return_when=asyncio.FIRST_COMPLETED)
        for task in (drain, second_signal):
            task.cancel()
    print("voxgate: shutting down", flush=True)
    await gateway.stop()
    return 0


def _run(coro: object) -> int:
    try:
        import uvloop
    except ImportError:  # uvloop is not available on Windows
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        from benchmark.bench.cli import main as bench_main

        return bench_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        gateway_config, engine_config = configs_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        return _run(_serve(gateway_config, engine_config, args.log_level))
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        return 130


if __name__ == "__main__":
    sys.exit(main())
