"""The ``voxgate`` command line: ``voxgate serve`` (gateway and engine) and ``voxgate bench``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import ssl
import subprocess
import sys
import textwrap
from dataclasses import fields
from typing import Callable

from engine.admission import ADMISSION_POLICIES, AdmissionConfig
from engine.config import EngineConfig
from engine.core import CoreConfig
from engine.llm.kernels import DECODE_ATTENTION_KERNELS, KV_WRITE_KINDS
from engine.llm.scheduler import parse_token_buckets
from gateway.config import MAX_ENGINES, GatewayConfig
from models import registry

__all__ = ["main", "build_parser", "configs_from_args", "check_device", "probe_cuda"]

log = logging.getLogger("voxgate")


_DESCRIPTION = """\
voxgate: a real-time streaming TTS gateway. Text goes in over a WebSocket, a word
at a time; speech comes out as audio frames while the text is still arriving."""

_EPILOG = """\
examples:
  voxgate serve                          the embedded CPU voice (hibari) on port 8000
  voxgate serve --model orpheus          Orpheus 3B on the GPU
  voxgate serve --model orpheus --load-format dummy
                                         Orpheus 3B with random weights, no download
  voxgate serve --model tiny --load-format dummy --device cpu
                                         a 2-layer toy Orpheus, random weights: smoke tests
  voxgate bench -c 1,8,32 -n 50          latency at 1, 8 and 32 concurrent streams

voxgate serve --help lists every setting; docs: README.md, docs/protocol.md,
docs/orpheus.md, docs/benchmark.md."""

_SERVE_DESCRIPTION = """\
Run the WebSocket gateway (ws://HOST:PORT/v1/stream; the demo page at /, /health,
/metrics) and its engine process. The basic options come first; the two GPU groups
at the end size and tune the Orpheus engine."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every option's help ends with its default, unless the help
    already names it or the option is an on/off flag."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.nargs == 0 or action.default is argparse.SUPPRESS
                or "default" in text or not action.option_strings):
            return text
        return text + " (default: %(default)s)"

    def _split_lines(self, text: str, width: int) -> list[str]:
        # argparse's wrap breaks at hyphens, which cuts a flag in two ("--load-" / "format").
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def _csv(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _add_serve_args(sp: argparse.ArgumentParser) -> None:
    # Groups print in the order they are made: the basic ones first, GPU tuning last.
    m = sp.add_argument_group("model")
    g = sp.add_argument_group("network")
    lim = sp.add_argument_group("limits")
    par = sp.add_argument_group(
        "engines (data parallel; docs/deploy.md)",
        "One engine process per GPU, or several CPU engines, behind one gateway and one port: each\n"
        "new stream goes to the engine with the most headroom; one engine's crash fails only its\n"
        "streams, and it restarts alone.")
    adm = sp.add_argument_group(
        "admission",
        "A stream is admitted at its first text while the engine's measured capacity has room\n"
        "(docs/scheduling.md); past it the stream waits or is refused with `capacity`.")
    sec = sp.add_argument_group("security (docs/security.md)")
    vo = sp.add_argument_group("registered voices (POST /v1/voices, models that can clone)")
    co = sp.add_argument_group("vendor protocols (OpenAI, ElevenLabs, Cartesia, Deepgram: docs/compat.md)")
    st = sp.add_argument_group("streaming")
    dbg = sp.add_argument_group("logging and debugging")
    gpu = sp.add_argument_group(
        "engine memory and precision (GPU)",
        "Orpheus on CUDA: how much of the GPU the engine takes, in which precision.")
    tune = sp.add_argument_group(
        "engine tuning (GPU)",
        "How the Orpheus engine schedules its steps. The defaults were measured on an\n"
        "H200 (docs/performance.md, docs/orpheus.md): change them only to measure.")

    m.add_argument("--model", default=EngineConfig.model,
                   help="a served name (" + ", ".join(e.name for e in registry.ENTRIES) + "; their "
                        "tiny random variants tiny, qwen3-tts-tiny, ...: each needs --load-format dummy), "
                        "a hub id of a served family, or a local checkpoint directory; "
                        "models.registry and the README's model table list them")
    m.add_argument("--device", default=EngineConfig.device, choices=["auto", "cpu", "cuda"],
                   help="auto: CUDA when torch sees a GPU, else the CPU; hibari and synthetic "
                        "run on the CPU only")
    m.add_argument("--load-format", default=EngineConfig.load_format, choices=["auto", "dummy"],
                   help="auto: read the checkpoint; dummy: random weights from the known "
                        "config, no files (benchmarks, smoke tests)")
    m.add_argument("--dtype", default=EngineConfig.dtype,
                   choices=["auto", "bfloat16", "float16", "float32"],
                   help="Orpheus weights and activations; auto: bfloat16 on CUDA, float32 on "
                        "the CPU")
    m.add_argument("--codec", dest="codec_path", default=None, metavar="DIR_OR_HUB_ID",
                   help="SNAC codec for Orpheus: a local directory or hub id "
                        "(default: hubertsiuzdak/snac_24khz)")
    m.add_argument("--lora", default=None, metavar="PATH",
                   help="VoxCPM2: a LoRA adapter (lora_weights.safetensors or its folder) folded into "
                        "the weights once at load; without it the base weights (default: none)")
    m.add_argument("--model-setting", dest="model_settings", action="append", default=[],
                   type=_model_setting, metavar="NAME=VALUE",
                   help="a model's own load-time setting (repeatable; the model's doc lists them, "
                        "e.g. VoxCPM2's stream_chunk_patches=2); a name the model does not read "
                        "stops the start with the names it does (default: none: the model's own)")
    m.add_argument("--synthetic-fast", dest="synthetic_realtime", action="store_false",
                   help="synthetic model: emit audio as fast as possible instead of at real time")
    m.add_argument("--synthetic-cloning", dest="synthetic_cloning", action="store_true",
                   help="synthetic model: accept registered voices (for tests of the voice store)")

    g.add_argument("--host", default=GatewayConfig.host,
                   help="address to bind; 0.0.0.0 for every interface")
    g.add_argument("--port", type=int, default=GatewayConfig.port, help="port; 0 picks a free one")

    lim.add_argument("--max-streams", type=int, default=CoreConfig.max_streams, metavar="N",
                     help="streams open at once over all connections; more get a retryable "
                          "`capacity` error (set it to the capacity `voxgate bench` measured)")
    lim.add_argument("--max-streams-per-connection", type=int, metavar="N",
                     default=GatewayConfig.max_streams_per_connection,
                     help="streams open at once on one WebSocket; more get a `capacity` error")
    lim.add_argument("--max-connections", type=int, metavar="N",
                     default=GatewayConfig.max_connections,
                     help="WebSocket connections at once; more get HTTP 503 with Retry-After at "
                          "the handshake (lowered at start to what the open-file limit allows)")
    lim.add_argument("--max-text-chars-per-stream", type=int, metavar="N",
                     default=GatewayConfig.max_text_chars_per_stream,
                     help="text characters one stream may send in all")
    lim.add_argument("--max-frame-bytes", type=int, metavar="BYTES",
                     default=GatewayConfig.max_frame_bytes,
                     help="largest client frame; larger ones close the connection with 1009")
    lim.add_argument("--max-outbox-bytes", type=int, metavar="BYTES",
                     default=GatewayConfig.max_outbox_bytes,
                     help="audio waiting for one slow client; past it the connection closes "
                          "with 1008")
    lim.add_argument("--idle-timeout-s", type=float, metavar="S",
                     default=GatewayConfig.idle_timeout_s,
                     help="a connection with no frame and no open stream for this long is "
                          "closed with 1001")
    lim.add_argument("--engine-start-timeout-s", type=float, metavar="S",
                     default=GatewayConfig.engine_start_timeout_s,
                     help="how long the engine may take to load and warm up before start-up fails")

    lim.add_argument("--engine-watchdog-s", type=float, metavar="S", default=GatewayConfig.engine_watchdog_s,
                     help="with streams open and no output or heartbeat from the engine for this "
                          "many seconds, kill and restart it (its streams get engine_restarted); 0 off")
    lim.add_argument("--max-engine-restarts", type=int, metavar="N", default=GatewayConfig.max_engine_restarts,
                     help="deaths of one engine tolerated within --engine-restart-window-s; one "
                          "more and that engine is given up; once no engine can serve, the server "
                          "tells its clients (engine_failed) and exits with status 1")
    lim.add_argument("--engine-restart-window-s", type=float, metavar="S",
                     default=GatewayConfig.engine_restart_window_s,
                     help="the window of --max-engine-restarts, seconds")
    lim.add_argument("--drain-timeout-s", type=float, metavar="S", default=GatewayConfig.drain_timeout_s,
                     help="on SIGTERM the server takes no new connections or streams (/health: "
                          "draining, 503) and lets streams in flight finish for this many "
                          "seconds; then the rest end with server_shutdown (retryable), close "
                          "1001. SIGINT (Ctrl-C) stops at once")

    par.add_argument("--gpus", type=_csv, metavar="IDS", default=GatewayConfig.gpus,
                     help="comma-separated CUDA devices (indices as nvidia-smi numbers them, or "
                          "GPU-/MIG- UUIDs): one engine process on each, which sees only its own "
                          "GPU (CUDA_VISIBLE_DEVICES); implies --device cuda; --gpus 0 is the "
                          "one-engine server on GPU 0 (default: none: one engine, on the device "
                          "--device picks)")
    par.add_argument("--engines", dest="num_engines", type=int, metavar="N", default=0,
                     help="engine processes: 0 for one per GPU of --gpus, else one; with --gpus, "
                          "a multiple of its GPUs, as many on each (--gpus 0 --engines 2: two "
                          "engines sharing GPU 0, each with half of --gpu-memory-utilization); "
                          "more than one without --gpus are CPU engines (--device cpu), for CPU "
                          "hosts and tests")

    sec.add_argument("--api-key", metavar="KEY", default=os.environ.get("VOXGATE_API_KEY", ""),
                     help="require this key on /v1/... and /metrics: 'Authorization: Bearer KEY', "
                          "'X-API-Key', 'xi-api-key' or ?api_key= (default: $VOXGATE_API_KEY, else none)")
    sec.add_argument("--allowed-origins", type=_csv, metavar="ORIGINS", default=GatewayConfig.allowed_origins,
                     help="comma-separated browser Origins that may use the WebSocket and change "
                          "state, besides the server's own page ('*': any; requests without an "
                          "Origin, as from agents, always may) (default: none)")
    sec.add_argument("--allowed-hosts", type=_csv, metavar="HOSTS", default=GatewayConfig.allowed_hosts,
                     help="comma-separated Host names the server answers to (bound to loopback, "
                          "loopback names always; elsewhere, unchecked unless given) (default: none)")
    sec.add_argument("--metrics-public", action="store_true",
                     help="serve /metrics without the API key")
    sec.add_argument("--ssl-certfile", metavar="FILE", default=GatewayConfig.ssl_certfile,
                     help="TLS: PEM certificate chain; the server then speaks https and wss "
                          "(default: none, plain TCP)")
    sec.add_argument("--ssl-keyfile", metavar="FILE", default=GatewayConfig.ssl_keyfile,
                     help="TLS: its private key, if not in --ssl-certfile (default: none)")
    sec.add_argument("--max-connections-per-ip", type=int, metavar="N", default=GatewayConfig.max_connections_per_ip,
                     help="WebSocket connections from one client address; more get 429 (0: no "
                          "limit; behind a proxy every client has the proxy's address)")
    sec.add_argument("--max-streams-per-ip", type=int, metavar="N", default=GatewayConfig.max_streams_per_ip,
                     help="active streams over all of one address's connections; more get "
                          "too_many_streams, retryable (0: no limit)")

    vo.add_argument("--data-dir", metavar="DIR", default=GatewayConfig.data_dir,
                   help="where registered voices are kept (default: $XDG_DATA_HOME/voxgate or "
                        "~/.local/share/voxgate; nothing is written until a voice is registered)")
    vo.add_argument("--max-voice-upload-bytes", type=int, metavar="BYTES", default=GatewayConfig.max_voice_upload_bytes,
                   help="largest upload, the whole request, in bytes; a larger one gets 413, before "
                        "its body is read when its Content-Length says so (default: 10 MiB)")
    vo.add_argument("--min-voice-duration-s", type=float, metavar="S", default=GatewayConfig.min_voice_duration_s,
                   help="shortest voice sample accepted, in seconds")
    vo.add_argument("--max-voice-duration-s", type=float, metavar="S", default=GatewayConfig.max_voice_duration_s,
                   help="longest voice sample accepted, in seconds (decoding stops there)")
    vo.add_argument("--min-voice-rms-dbfs", type=float, metavar="DB", default=GatewayConfig.min_voice_rms_dbfs,
                   help="a sample whose RMS level is below this many dB of full scale is refused "
                        "as silent")
    vo.add_argument("--max-voice-name-chars", type=int, metavar="N", default=GatewayConfig.max_voice_name_chars,
                   help="longest voice name (letters, digits, spaces and - _ . ' ( ))")
    vo.add_argument("--max-voice-transcript-chars", type=int, metavar="N",
                   default=GatewayConfig.max_voice_transcript_chars,
                   help="longest transcript of a voice sample, in characters")
    vo.add_argument("--max-voices", type=int, metavar="N", default=GatewayConfig.max_voices,
                   help="voices kept at most; registering more gets 409")

    co.add_argument("--compat-voice-map", type=_csv, metavar="NAME=VOICE,...",
                    default=GatewayConfig.compat_voice_map,
                    help="vendor voice ids or model names mapped to served voices, e.g. "
                         "alloy=heart,aura-2-thalia-en=heart (default: none)")
    co.add_argument("--compat-unknown-voice", default=GatewayConfig.compat_unknown_voice,
                    choices=["default", "refuse"],
                    help="a vendor voice name that is neither mapped nor served: speak in the "
                         "default voice (clients that check their own voice lists work), or refuse "
                         "it with the protocol's error (default: %(default)s)")
    adm.add_argument("--admission", dest="admission_policy", default=AdmissionConfig.policy,
                     choices=list(ADMISSION_POLICIES),
                     help="past capacity, queue: a new stream waits for room (bounded by the two "
                          "settings below), refuse: it gets a retryable `capacity` error with a "
                          "retry_after_s hint at once, off: every stream is admitted (capacity "
                          "still measured and exported)")
    adm.add_argument("--admission-max-queue", type=int, metavar="N", default=AdmissionConfig.max_queue,
                     help="streams waiting for admission at once; one more is refused")
    adm.add_argument("--admission-max-wait-s", type=float, metavar="S",
                     default=AdmissionConfig.max_wait_s,
                     help="longest wait for admission (it counts in the time to first audio): a "
                          "stream expected to wait longer is refused at once, one still waiting "
                          "then is refused")
    adm.add_argument("--admission-headroom", type=float, metavar="FRACTION",
                     default=AdmissionConfig.headroom,
                     help="share of the engine's time kept free of the admitted streams' steady "
                          "work, for bursts of prompts, codec work and step-time variation")
    adm.add_argument("--admission-initial-capacity", type=int, metavar="N",
                     default=AdmissionConfig.initial_capacity,
                     help="streams admitted until the engine has measured enough steps, and the "
                          "only limit for a model that is not step-based (hibari, synthetic); "
                          "0: no cap")
    adm.add_argument("--decode-cap-budget", type=float, metavar="FRACTION",
                     default=AdmissionConfig.decode_cap_budget,
                     help="the decode cap from this engine's measured step times: the most decode "
                          "rows whose step takes at most this fraction of the real-time step (0.8: "
                          "80%%), never above --max-num-decode-seqs (or the batch slots); 0: off, "
                          "the cap stays a constant; -1: the model's (Orpheus 0.85 with bf16 "
                          "weights; off for the others)")

    st.add_argument("--lookahead-jobs", type=int, default=CoreConfig.lookahead_jobs, metavar="N",
                    help="segments of a stream generated ahead of the one being spoken")

    dbg.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                     help="log level of the gateway and engine processes")
    dbg.add_argument("--debug-timestamps", action="store_true",
                     help="add engine_t (engine emit time, CLOCK_MONOTONIC) to audio messages")

    gpu.add_argument("--gpu-memory-utilization", type=float, metavar="FRACTION",
                     default=EngineConfig.gpu_memory_utilization,
                     help="fraction of the GPU's memory for weights, KV cache and graphs; "
                          "engines sharing a GPU (--gpus 0 --engines 2) split it evenly")
    gpu.add_argument("--codec-device", default=EngineConfig.codec_device, metavar="DEVICE",
                     help="run the model's codec on another device than the LM (cuda:1: the LM on "
                          "the first GPU, the codec on the second; cpu); only models that support "
                          "it (orpheus) (default: the LM's device)")
    gpu.add_argument("--max-num-seqs", type=int, default=EngineConfig.max_num_seqs, metavar="N",
                     help="segments generating at once (KV cache and batch slots); a stream "
                          "holds up to two, the one spoken and the one generated ahead, and the "
                          "engine admits no more streams than it has slots "
                          "(docs/scheduling.md, 'The job slots')")
    gpu.add_argument("--max-model-len", type=int, default=EngineConfig.max_model_len, metavar="TOKENS",
                     help="prompt and audio tokens a segment's row holds (-1 auto: 2048, or the "
                          "model's positions where it has fewer)")
    gpu.add_argument("--quantization", default=EngineConfig.quantization, choices=["none", "fp8"],
                     help="fp8: decoder linear weights in fp8 with per-channel scales, row-wise "
                          "fp8 GEMMs (CUDA, compute capability >= 8.9)")
    gpu.add_argument("--kv-cache-dtype", default=EngineConfig.kv_cache_dtype, choices=["auto", "fp8"],
                     help="fp8: KV cache pages in float8_e4m3fn, half the bytes (CUDA, bf16 only; "
                          "see docs/orpheus.md 'fp8 option')")
    gpu.add_argument("--no-cuda-graphs", dest="enable_cuda_graphs", action="store_false",
                     help="run the model eagerly instead of replaying captured CUDA graphs "
                          "(slower; for debugging)")

    tune.add_argument("--max-num-decode-seqs", type=int, metavar="N",
                      default=EngineConfig.max_num_decode_seqs,
                      help="decode rows per step, earliest deadlines first; the rest wait a step "
                           "(-1 auto: the model's on CUDA, Orpheus 512 with the cap measured "
                           "below it (--decode-cap-budget) and 448 with --quantization fp8; no cap "
                           "on the CPU; 0 no cap)")
    tune.add_argument("--decode-horizon-s", type=float, default=EngineConfig.decode_horizon_s,
                      metavar="S",
                      help="decode only jobs whose audio is due within this many seconds, so the "
                           "step is short for those that need audio now (-1 auto: 1.0 on CUDA, "
                           "off on the CPU; 0 off)")
    tune.add_argument("--decode-fill-seqs", type=int, default=EngineConfig.decode_fill_seqs,
                      metavar="N",
                      help="with a decode horizon, rows decoded anyway, earliest deadlines first "
                           "(-1 auto: 256 on CUDA)")
    tune.add_argument("--prefill-wait-s", type=float, default=EngineConfig.prefill_wait_s,
                      metavar="S",
                      help="under load, a new prompt waits up to this long for others to share "
                           "its prefill pass (-1 auto: the model's with CUDA graphs, Orpheus 0.1; "
                           "0 off)")
    tune.add_argument("--prefill-batch-seqs", type=int, default=EngineConfig.prefill_batch_seqs,
                      metavar="N",
                      help="prompts that go at once without waiting (-1 auto: the model's with "
                           "CUDA graphs, Orpheus 16)")
    tune.add_argument("--light-steps", type=int, default=EngineConfig.light_steps, metavar="N",
                      help="a new sequence's first steps that the model runs in a cheaper variant "
                           "(Kyutai TTS: before its first codes) take up to N steps in a row of "
                           "their own while the other due rows can wait (-1 auto: the model's, "
                           "Kyutai TTS 4 on CUDA, others off; 0 off)")
    tune.add_argument("--light-slack-s", type=float, default=EngineConfig.light_slack_s, metavar="S",
                      help="light steps run while no playing stream is due within S seconds "
                           "(default: %(default)s)")
    tune.add_argument("--sampler-kernel", choices=("auto", "torch", "triton"), default=EngineConfig.sampler_kernel,
                      help="the sampler's draw: torch's operators, or one Triton kernel a sample "
                           "for vocabularies up to 8,192 (frame models' codebooks; CUDA); auto: "
                           "the model's choice on CUDA (Qwen3-TTS triton, others torch), torch elsewhere")
    tune.add_argument("--hold-undue-prompts", default=EngineConfig.hold_undue_prompts,
                      choices=["on", "off"],
                      help="under load, prompts not due within the decode horizon (segments "
                           "generated ahead) wait until due or until a step has room (off: not "
                           "measured on a GPU)")
    tune.add_argument("--async-steps", default=EngineConfig.async_steps, choices=["auto", "on", "off"],
                      help="launch each LM step before the previous step's tokens reach the host, "
                           "rows continuing from them on the device (auto: on with CUDA graphs)")
    tune.add_argument("--mixed-graphs", default=EngineConfig.mixed_graphs, choices=["on", "off"],
                      help="a step with decode rows and fresh prompts replays one CUDA graph (one "
                           "pass over the weights) instead of two (off: on an H200 no more "
                           "streams kept real time)")
    tune.add_argument("--async-plan", default=EngineConfig.async_plan, choices=["on", "off"],
                      help="the decode graphs' attention plans send page ids to the GPU without "
                           "waiting for the step in flight (on: engine steps 2-7%% shorter on an "
                           "H200)")
    tune.add_argument("--decode-attention", default=EngineConfig.decode_attention,
                      choices=["auto", *DECODE_ATTENTION_KERNELS],
                      help="the decode attention in the CUDA graphs: FlashInfer's CUDA-core decode "
                           "kernel, or its tensor-core prefill kernel (slower at served contexts "
                           "on an H200), or the runtime's Triton kernel (auto: the model's on "
                           "CUDA: Orpheus triton, with its other Triton kernels; the others "
                           "cuda-cores)")
    tune.add_argument("--prefill-token-buckets", type=_token_counts,
                      default=EngineConfig.prefill_token_buckets, metavar="N,N,...",
                      help="the prefill graphs' token counts, increasing (default: the model's: "
                           "Orpheus 32,64,96,128,192,256,384,512, the others 32,64,128,256,512; "
                           "finer steps pad prompts less for more graphs)")
    tune.add_argument("--kv-write", default=EngineConfig.kv_write, choices=["auto", *KV_WRITE_KINDS],
                      help="how a step's keys and values are stored into the KV cache: two "
                           "index_put kernels a layer, or one Triton kernel (CUDA; auto: the "
                           "model's: Orpheus triton, the others index)")
    tune.add_argument("--ramp-step-samples", type=int, default=EngineConfig.ramp_step_samples,
                      metavar="SAMPLES",
                      help="Orpheus fast-start ramp: lookahead growth per frame in samples (1024: "
                           "1,024 samples in each of the first 4 frames; 1536: 1024, 512, 512, "
                           "1387; 0 auto: 1024, or 1536 while frames take over 35 ms, on CUDA)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxgate", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,bench}",
                                title="commands")
    serve = sub.add_parser("serve", help="run the WebSocket gateway and its engine",
                           description=_SERVE_DESCRIPTION, formatter_class=_HelpFormatter,
                           usage="%(prog)s [options]  (all of them below)")
    _add_serve_args(serve)
    sub.add_parser("bench", help="the latency benchmark client (voxgate bench --help)",
                   add_help=False)
    return parser


def check_device(config: EngineConfig, *,
                 cuda_probe: Callable[[], str | None] | None = None,
                 gpus: tuple[str, ...] = ()) -> str | None:
    """Why ``config.device`` cannot work here, in one line, or None. ``--device cuda`` needs a
    GPU that torch sees (probed in a child process, so that the gateway never imports torch),
    and with ``--gpus`` every GPU listed; a CPU-only model with it is refused by
    ``EngineConfig`` (``models.registry``)."""
    if config.device != "cuda":
        return None
    if cuda_probe is not None:
        return cuda_probe()
    return probe_cuda(gpus=gpus) if gpus else probe_cuda()


# Run in a child process: importing torch (and initialising CUDA) stays out of the gateway.
_PROBE = """\
import sys
import textwrap
try:
    import torch
except ImportError:
    sys.exit("torch is not installed")
if torch.version.cuda is None:
    sys.exit(f"torch {torch.__version__} is a CPU build")
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA GPU")
wanted = sys.argv[1:]  # --gpus, as CUDA_VISIBLE_DEVICES (it stops at the first it cannot find)
if wanted and torch.cuda.device_count() < len(wanted):
    sys.exit(f"torch sees {torch.cuda.device_count()} of the {len(wanted)} GPUs of --gpus "
             f"{','.join(wanted)} (nvidia-smi -L lists them)")
"""


def probe_cuda(timeout_s: float = 120.0, *, gpus: tuple[str, ...] = ()) -> str | None:
    """None when torch sees a CUDA GPU (and, given ``gpus``, each of them), else why not (one
    line)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else None
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE, *gpus], capture_output=True,
                              text=True, timeout=timeout_s, check=False, env=env)
    except subprocess.TimeoutExpired:
        return f"--device cuda: torch did not answer within {timeout_s:g} s whether it sees a GPU"
    if done.returncode == 0:
        return None
    lines = (done.stderr.strip() or "unknown error").splitlines()
    return (f"--device cuda: {lines[-1]}; use --device cpu (or auto), or install the GPU "
            "stack (pip install -e \".[gpu]\") on a machine with an NVIDIA GPU")


def _engine_layout(gpus: tuple[str, ...], num_engines: int,
                   device: str) -> tuple[tuple[str, ...], int, str, int]:
    """``--gpus`` / ``--engines`` / ``--device`` as (gpus, engines, device, engines per GPU),
    or a ValueError that names the flags."""
    if num_engines < 0:
        raise ValueError(f"--engines must be 0 (one per GPU of --gpus, else one) or a count of "
                         f"engines, got {num_engines}")
    if num_engines > MAX_ENGINES:
        raise ValueError(f"--engines {num_engines}: at most {MAX_ENGINES} engines per server")
    if gpus:
        if device == "cpu":
            raise ValueError("--gpus runs engines on GPUs; it does not go with --device cpu")
        listed = ",".join(gpus)
        twice = sorted({g for g in gpus if gpus.count(g) > 1})
        if twice:
            raise ValueError(f"--gpus {listed} lists GPU {twice[0]} more than once; for several "
                             f"engines on one GPU use --gpus {twice[0]} --engines N")
        num_engines = num_engines or len(gpus)
        if num_engines % len(gpus):
            raise ValueError(f"--engines {num_engines} with --gpus {listed}: every GPU gets as "
                             f"many engines, so --engines must be a multiple of {len(gpus)}")
        return gpus, num_engines, "cuda", num_engines // len(gpus)
    num_engines = num_engines or 1
    if num_engines > 1 and device == "cuda":
        raise ValueError(f"--engines {num_engines} without --gpus runs CPU engines; on a GPU use "
                         f"--gpus 0 --engines {num_engines} (engines sharing GPU 0) or --gpus "
                         "0,1,... (one engine per GPU)")
    return (), num_engines, ("cpu" if num_engines > 1 else device), 1


def _token_counts(text: str) -> tuple[int, ...]:
    """``--prefill-token-buckets 32,64,192`` -> (32, 64, 192): whole numbers >= 1, increasing."""
    try:
        return parse_token_buckets(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _model_setting(text: str) -> tuple[str, str]:
    """``--model-setting NAME=VALUE`` -> (name, value)."""
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (a setting's name, '=', its value), got {text!r}")
    return name, value.strip()


def configs_from_args(args: argparse.Namespace) -> tuple[GatewayConfig, EngineConfig]:
    """Map parsed arguments onto the two process configurations (raises ValueError)."""
    values = dict(vars(args))
    values["model_settings"] = tuple(values.get("model_settings") or ())
    values["gpus"], values["num_engines"], values["device"], values["gpu_memory_share"] = (
        _engine_layout(tuple(values.get("gpus") or ()), values.get("num_engines") or 0,
                       values["device"]))
    if values["gpus"]:
        entry = registry.resolve(values["model"]).entry  # an unknown name lists what is served
        if entry.device == "cpu":
            raise ValueError(f"--gpus runs engines on GPUs, and --model {entry.name} runs on the "
                             "CPU only; for several CPU engines use --engines N")
    gateway = GatewayConfig(**{f.name: values[f.name] for f in fields(GatewayConfig)
                               if f.name in values})
    core = CoreConfig(lookahead_jobs=args.lookahead_jobs, max_streams=args.max_streams)
    admission = AdmissionConfig(policy=args.admission_policy, max_queue=args.admission_max_queue,
                                max_wait_s=args.admission_max_wait_s, headroom=args.admission_headroom,
                                initial_capacity=args.admission_initial_capacity,
                                decode_cap_budget=args.decode_cap_budget)
    engine = EngineConfig(core=core, admission=admission,
                          **{f.name: values[f.name] for f in fields(EngineConfig)
                             if f.name in values and f.name not in ("core", "admission")})
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
    num_engines = gateway_config.num_engines
    what = "the engine" if num_engines == 1 else f"{num_engines} engines"
    gpus, per_gpu = gateway_config.gpus, gateway_config.num_engines_per_gpu
    on = (f" on GPU{'s' * (len(gpus) > 1)} {','.join(gpus)}"
          f"{f', {per_gpu} per GPU' if per_gpu > 1 else ''}" if gpus else "")
    print(f"voxgate: starting {what} (model {engine_config.model}){on} ...", flush=True)
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
        weights = " (random weights: --load-format dummy, noise)" if hello.weights == "random" else ""
        print(f"voxgate: model {hello.model}{weights} on {hello.device}", flush=True)
    http_scheme, ws_scheme = ("https", "wss") if gateway_config.ssl_certfile else ("http", "ws")
    print(f"voxgate: serving on {http_scheme}://{shown}:{gateway.port}/ (demo page); "
          f"WebSocket {ws_scheme}://{shown}:{gateway.port}/v1/stream", flush=True)
    failed = asyncio.create_task(gateway.engine.wait_failed())
    await asyncio.wait({first_signal, failed}, return_when=asyncio.FIRST_COMPLETED)
    if (not failed.done() and first_signal.result() == signal.SIGTERM
            and gateway_config.drain_timeout_s > 0):
        print(f"voxgate: draining: streams in flight may finish for "
              f"{gateway_config.drain_timeout_s:g} s (--drain-timeout-s)", flush=True)
        drain = asyncio.create_task(gateway.drain(gateway_config.drain_timeout_s))
        second_signal = asyncio.create_task(signals.get())
        await asyncio.wait({drain, second_signal, failed}, return_when=asyncio.FIRST_COMPLETED)
        for task in (drain, second_signal):
            task.cancel()
    is_failed = failed.done()
    for task in (first_signal, failed):
        task.cancel()
    if is_failed:  # clients were told (engine_failed); exit non-zero for a supervisor to restart
        print(f"voxgate: error: {gateway.engine.last_error}; exiting", file=sys.stderr, flush=True)
    else:
        print("voxgate: shutting down", flush=True)
    await gateway.stop()
    return 1 if is_failed else 0


def _run(coro: object) -> int:
    try:
        import uvloop
    except ImportError:  # uvloop is not available on Windows
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]


def _usage_error(message: str) -> int:
    """One line on stderr and exit status 2, as argparse does for a bad flag."""
    print(f"voxgate serve: error: {message}", file=sys.stderr, flush=True)
    return 2


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
        return _usage_error(str(exc))
    problem = check_device(engine_config, gpus=gateway_config.gpus)
    if problem is not None:
        return _usage_error(problem)
    try:
        return _run(_serve(gateway_config, engine_config, args.log_level))
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed
        return 130


if __name__ == "__main__":
    sys.exit(main())
