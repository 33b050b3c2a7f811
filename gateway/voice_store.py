"""Registered voices on disk: one 16-bit mono WAV per voice and an SQLite index, read once into
memory (docs/architecture.md, "Gateway").
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import logging
import os
import secrets
import sqlite3
import tempfile
import threading
import time
import wave
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.messages import VoiceRef

__all__ = ["VoiceRecord", "VoiceStore", "VoiceStoreFull", "default_data_dir"]

log = logging.getLogger("voxgate.voices")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS voices (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    file TEXT NOT NULL,
    sample_rate INTEGER NOT NULL,
    num_samples INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    transcript TEXT,
    created_at REAL NOT NULL
)
"""
_COLUMNS = ("id", "name", "file", "sample_rate", "num_samples", "sha256", "transcript",
            "created_at")
_TMP_PREFIX = ".upload-"


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/voxgate``, else ``~/.local/share/voxgate``."""
    base = os.environ.get("XDG_DATA_HOME")
    return (Path(base) if base else Path.home() / ".local" / "share") / "voxgate"


class VoiceStoreFull(RuntimeError):
    """The store holds ``max_voices`` voices already."""


@dataclass(frozen=True)
class VoiceRecord:
    id: str
    name: str
    file: str  # the WAV's name inside the voices folder
    sample_rate: int
    num_samples: int
    sha256: str  # of the WAV file
    transcript: str | None
    created_at: float  # Unix time

    @property
    def duration_s(self) -> float:
        return self.num_samples / self.sample_rate

    def summary(self) -> dict[str, Any]:
        """The fields ``GET /v1/voices`` lists."""
        created = datetime.datetime.fromtimestamp(self.created_at, datetime.timezone.utc)
        return {"id": self.id, "name": self.name, "duration_s": round(self.duration_s, 3),
                "sample_rate": self.sample_rate, "has_transcript": self.transcript is not None,
                "created_at": created.isoformat(timespec="seconds").replace("+00:00", "Z")}

    def details(self) -> dict[str, Any]:
        """``GET /v1/voices/{id}``: the summary, the transcript and the file's sha256."""
        return {**self.summary(), "transcript": self.transcript, "sha256": self.sha256}


class VoiceStore:
    """The voices registered under ``data_dir``."""

    def __init__(self, data_dir: Path, *, max_voices: int) -> None:
        self.folder = Path(data_dir) / "voices"
        self.index_path = self.folder / "index.sqlite3"
        self.max_voices = max_voices
        self._db: sqlite3.Connection | None = None
        self._voices: dict[str, VoiceRecord] = {}
        self._lock = threading.Lock()

    # --- lifecycle (blocking) --------------------------------------------------------------

    def open(self) -> None:
        """Load the index if there is one, and sweep what an interrupted write left."""
        with self._lock:
            if self.index_path.exists():
                self._connect()
                self._sweep()

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.index_path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)
            rows = db.execute(f"SELECT {', '.join(_COLUMNS)} FROM voices ORDER BY created_at")
            self._voices = {row[0]: VoiceRecord(*row) for row in rows}
            self._db = db
        return self._db

    def _sweep(self) -> None:
        db = self._connect()
        files = {rec.file for rec in self._voices.values()}
        for path in self.folder.iterdir():
            if path.name.startswith(_TMP_PREFIX) or (path.suffix == ".wav" and path.name not in files):
                log.warning("removing %s: left by an interrupted registration", path)
                path.unlink(missing_ok=True)
        for rec in list(self._voices.values()):
            if not (self.folder / rec.file).is_file():
                log.warning("voice %s (%s): its file is gone; dropping it from the index",
                            rec.id, rec.name)
                with _transaction(db):
                    db.execute("DELETE FROM voices WHERE id = ?", (rec.id,))
                self._voices = {k: v for k, v in self._voices.items() if k != rec.id}

    # --- reads (in memory, never block) ----------------------------------------------------

    def list(self) -> list[VoiceRecord]:
        return list(self._voices.values())

    def get(self, voice_id: str) -> VoiceRecord | None:
        return self._voices.get(voice_id)

    def __len__(self) -> int:
        return len(self._voices)

    def resolve(self, voice: str) -> VoiceRef | None:
        """The voice a ``start`` names, by id, or by name when one voice has it; ``None`` when
        none does. Raises ``LookupError`` (its message lists the ids) for a name several share."""
        voices = self._voices
        rec = voices.get(voice)
        if rec is None:
            named = [r for r in voices.values() if r.name == voice]
            if len(named) > 1:
                raise LookupError(f"{len(named)} registered voices are named {voice!r}; name one "
                                  f"by its id: {', '.join(r.id for r in named)}")
            rec = named[0] if named else None
        return None if rec is None else self.ref(rec)

    def ref(self, rec: VoiceRecord) -> VoiceRef:
        return VoiceRef(rec.id, str(self.folder / rec.file), rec.sample_rate, rec.sha256,
                        rec.transcript)

    # --- writes (blocking: run off the event loop) -----------------------------------------

    def add(self, name: str, samples: np.ndarray, sample_rate: int,
            transcript: str | None) -> VoiceRecord:
        """Store float32 mono ``samples`` as a new voice. Raises ``VoiceStoreFull``, or
        ``OSError``/``sqlite3.Error`` with nothing left behind."""
        with self._lock:
            if len(self._voices) >= self.max_voices:
                raise VoiceStoreFull(f"the server keeps at most {self.max_voices} voices "
                                     "(--max-voices); delete one first")
            db = self._connect()
            voice_id = "v-" + secrets.token_hex(8)
            final = self.folder / f"{voice_id}.wav"
            tmp = _write_wav(self.folder, samples, sample_rate)
            try:
                sha256 = _sha256(tmp)
                os.replace(tmp, final)
                rec = VoiceRecord(voice_id, name, final.name, sample_rate, int(samples.size),
                                  sha256, transcript, time.time())
                with _transaction(db):
                    db.execute(f"INSERT INTO voices ({', '.join(_COLUMNS)}) VALUES "
                               f"({', '.join('?' * len(_COLUMNS))})",
                               tuple(getattr(rec, c) for c in _COLUMNS))
            except BaseException:
                tmp.unlink(missing_ok=True)
                final.unlink(missing_ok=True)
                raise
            _fsync_dir(self.folder)
            self._voices = {**self._voices, voice_id: rec}
            return rec

    def delete(self, voice_id: str) -> bool:
        """Remove a voice (its row, then its file); ``False`` if there is none."""
        with self._lock:
            rec = self._voices.get(voice_id)
            if rec is None:
                return False
            db = self._connect()
            with _transaction(db):
                db.execute("DELETE FROM voices WHERE id = ?", (voice_id,))
            self._voices = {k: v for k, v in self._voices.items() if k != voice_id}
            (self.folder / rec.file).unlink(missing_ok=True)
            return True


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any error (autocommit connection)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _write_wav(folder: Path, samples: np.ndarray, sample_rate: int) -> Path:
    """16-bit mono WAV in a temporary file in ``folder``, flushed to disk."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2")
    fd, name = tempfile.mkstemp(dir=folder, prefix=_TMP_PREFIX, suffix=".wav")
    path = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            with wave.open(f, "wb") as wav:
                wav.setnchannels(1)
                wav.setsampwidth(2)
                wav.setframerate(sample_rate)
                wav.writeframes(pcm.tobytes())
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable (POSIX); best effort elsewhere."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
