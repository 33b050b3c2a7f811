"""The gateway process's configuration: one dataclass, validated; the command line maps onto it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GatewayConfig"]


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
    max_connections: int = 2048
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
    debug_timestamps: bool = False  # add engine_t (engine emit time) to audio messages

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        for name in ("max_frame_bytes", "max_text_chars_per_stream", "max_streams_per_connection",
                     "max_outbox_bytes", "max_connections"):
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

    def limits(self) -> dict[str, float | int]:
        """The limits announced in ``hello``."""
        return {
            "max_streams_per_connection": self.max_streams_per_connection,
            "max_text_chars_per_stream": self.max_text_chars_per_stream,
            "max_frame_bytes": self.max_frame_bytes,
            "idle_timeout_s": self.idle_timeout_s,
        }
