"""The gateway process's configuration: one dataclass, validated; the command line maps onto it."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["GatewayConfig", "MAX_ENGINES"]

MAX_ENGINES = 64  # engine processes one gateway runs (--gpus, --engines)
# A CUDA_VISIBLE_DEVICES entry: an index, or a GPU / MIG UUID as nvidia-smi -L prints it.
_GPU_ID = re.compile(r"\d+|GPU-[0-9A-Fa-f-]+|MIG-[0-9A-Za-z/-]+")


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    # client <-> gateway limits
    max_frame_bytes: int = 1024 * 1024  # larger frames close the connection with 1009
    max_text_chars_per_stream: int = 50_000
    max_streams_per_connection: int = 32
    idle_timeout_s: float = 300.0  # no frame and no active stream for this long: close 1001
    # Audio waiting to be written to one client. Past this the client is not reading: close 1008.
    max_outbox_bytes: int = 8 * 1024 * 1024
    max_connections: int = 2048  # lowered at start to what the open-file limit allows
    max_connections_per_ip: int = 0  # 0: no limit (behind a proxy every client has its IP)
    max_streams_per_ip: int = 0  # active streams over all of an IP's connections; 0: no limit
    drain_timeout_s: float = 20.0  # on SIGTERM, streams in flight may finish for this long
    # engine supervision
    engine_start_timeout_s: float = 600.0
    engine_restart_backoff_s: float = 1.0
    # More engine deaths than this within engine_restart_window_s: the gateway tells its
    # clients (engine_failed) and exits non-zero, for systemd or Kubernetes to restart it.
    max_engine_restarts: int = 5
    engine_restart_window_s: float = 300.0
    # With streams open and nothing from the engine (no output, no heartbeat) for this long,
    # the engine is taken for hung: killed and restarted. 0 = off.
    engine_watchdog_s: float = 10.0
    # Data parallel (gateway.engine_pool): `num_engines` engine processes on the GPUs in `gpus`
    # (each sees only its own: CUDA_VISIBLE_DEVICES), as many on each (num_engines a multiple of
    # len(gpus): engine i on gpus[i % len(gpus)]); with no gpus, CPU engines when more than one.
    gpus: tuple[str, ...] = ()
    num_engines: int = 1
    debug_timestamps: bool = False  # add engine_t (engine emit time) to audio messages
    # who may connect (gateway.security, docs/security.md)
    api_key: str = ""  # "": none needed
    allowed_origins: tuple[str, ...] = ()  # browser Origins besides the server's own; "*": any
    allowed_hosts: tuple[str, ...] = ()  # Host names accepted (loopback names are, when bound there)
    metrics_public: bool = False  # /metrics without the API key
    ssl_certfile: str = ""  # TLS: a PEM certificate chain (https, wss); "": plain TCP
    ssl_keyfile: str = ""  # its private key, when not in ssl_certfile
    # registered voices (POST /v1/voices), kept under data_dir ("": the user's data folder,
    # $XDG_DATA_HOME/voxgate or ~/.local/share/voxgate)
    data_dir: str = ""
    max_voice_upload_bytes: int = 10 * 1024 * 1024  # the whole request; more: 413, unread
    min_voice_duration_s: float = 1.0
    max_voice_duration_s: float = 30.0
    min_voice_rms_dbfs: float = -50.0  # a clip whose level is below this is silent
    max_voice_name_chars: int = 64
    max_voice_transcript_chars: int = 2000
    max_voices: int = 100
    # the vendor protocols (gateway.compat, docs/compat.md): "NAME=VOICE" entries mapping a
    # vendor's voice id or model name to a served voice; any other unknown name is the served
    # default voice ("default") or refused ("refuse")
    compat_voice_map: tuple[str, ...] = ()
    compat_unknown_voice: str = "default"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for name in ("max_connections_per_ip", "max_streams_per_ip"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: no limit)")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("ssl_keyfile needs ssl_certfile")
        for name in ("max_frame_bytes", "max_text_chars_per_stream", "max_streams_per_connection",
                     "max_outbox_bytes", "max_connections", "max_voice_upload_bytes",
                     "max_voice_name_chars", "max_voice_transcript_chars", "max_voices"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("idle_timeout_s", "engine_start_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.engine_restart_backoff_s < 0:
            raise ValueError("engine_restart_backoff_s must be >= 0")
        if self.max_engine_restarts < 0:
            raise ValueError("max_engine_restarts must be >= 0")
        if self.engine_restart_window_s <= 0:
            raise ValueError("engine_restart_window_s must be > 0")
        # The engine beats once a second (engine.process.HEARTBEAT_INTERVAL_S): a watchdog
        # shorter than a few beats would take a busy machine's scheduling delay for a hang.
        if self.engine_watchdog_s != 0 and not self.engine_watchdog_s >= 3.0:
            raise ValueError("engine_watchdog_s must be 0 (off) or >= 3 seconds")
        if not 1 <= self.num_engines <= MAX_ENGINES:
            raise ValueError(f"num_engines must be in [1, {MAX_ENGINES}], got {self.num_engines}")
        for gpu in self.gpus:
            if not _GPU_ID.fullmatch(gpu):
                raise ValueError(f"gpus: {gpu!r} is not a GPU index (0, 1, ...) or a GPU-/MIG- "
                                 "UUID (nvidia-smi -L)")
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"gpus: a GPU is listed twice in {','.join(self.gpus)}")
        if self.gpus and self.num_engines % len(self.gpus):
            raise ValueError(f"num_engines ({self.num_engines}) must be a multiple of the number "
                             f"of gpus ({len(self.gpus)}): as many engines on each GPU")
        if self.drain_timeout_s < 0:
            raise ValueError("drain_timeout_s must be >= 0")
        if not 0 < self.min_voice_duration_s <= self.max_voice_duration_s:
            raise ValueError("voice durations must satisfy 0 < min_voice_duration_s <= "
                             f"max_voice_duration_s, got {self.min_voice_duration_s} and "
                             f"{self.max_voice_duration_s}")
        for entry in self.compat_voice_map:
            name, sep, voice = entry.partition("=")
            if not sep or not name.strip() or not voice.strip():
                raise ValueError(f"compat_voice_map entries are NAME=VOICE, got {entry!r}")
        if self.compat_unknown_voice not in ("default", "refuse"):
            raise ValueError("compat_unknown_voice must be 'default' or 'refuse', got "
                             f"{self.compat_unknown_voice!r}")
        if not self.min_voice_rms_dbfs < 0:
            raise ValueError(f"min_voice_rms_dbfs must be < 0 (dB below full scale), got "
                             f"{self.min_voice_rms_dbfs}")

    def limits(self) -> dict[str, float | int]:
        """The limits announced in ``hello``."""
        return {
            "max_streams_per_connection": self.max_streams_per_connection,
            "max_text_chars_per_stream": self.max_text_chars_per_stream,
            "max_frame_bytes": self.max_frame_bytes,
            "idle_timeout_s": self.idle_timeout_s,
        }

    @property
    def num_engines_per_gpu(self) -> int:
        """Engines sharing each GPU of ``gpus`` (1 with no gpus)."""
        return self.num_engines // len(self.gpus) if self.gpus else 1
