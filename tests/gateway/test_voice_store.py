"""gateway.voice_store: voices kept as WAV + SQLite survive a reopen; failures and crashes leave nothing behind."""

from __future__ import annotations

import hashlib
import sqlite3
import wave
from pathlib import Path

import numpy as np
import pytest

from gateway import voice_store
from gateway.voice_store import VoiceStore, VoiceStoreFull, default_data_dir


def _samples(seconds: float = 1.0, rate: int = 16000) -> np.ndarray:
    t = np.arange(round(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)


def _files(store: VoiceStore) -> set[str]:
    return {p.name for p in store.folder.iterdir()} - {"index.sqlite3", "index.sqlite3-wal",
                                                        "index.sqlite3-shm"}


def test_nothing_is_written_until_a_voice_is_added(tmp_path: Path) -> None:
    """Opening a store on an empty data dir creates no folder; it lists no voices."""
    store = VoiceStore(tmp_path / "data", max_voices=4)
    store.open()
    assert store.list() == [] and not (tmp_path / "data").exists()


def test_add_writes_a_16_bit_wav_and_its_sha256_and_reopen_finds_it(tmp_path: Path) -> None:
    """An added voice is a mono 16-bit WAV at its rate whose sha256 is recorded; a new store on
    the same folder lists it with the same fields and resolves it by id and by name."""
    store = VoiceStore(tmp_path, max_voices=4)
    store.open()
    rec = store.add("Alice", _samples(1.5, 22050), 22050, "Hi there.")
    path = store.folder / rec.file
    with wave.open(str(path)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes()) == (1, 2, 22050, 33075)
    assert rec.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    store.close()
    again = VoiceStore(tmp_path, max_voices=4)
    again.open()
    assert again.list() == [rec]
    ref = again.resolve("Alice")
    assert ref == again.resolve(rec.id) and ref is not None
    assert (ref.voice_id, ref.path, ref.sample_rate, ref.sha256, ref.transcript) == (
        rec.id, str(path), 22050, rec.sha256, "Hi there.")
    assert rec.summary() == {"id": rec.id, "name": "Alice", "duration_s": 1.5, "sample_rate": 22050,
                             "has_transcript": True, "created_at": rec.summary()["created_at"]}
    assert rec.summary()["created_at"].endswith("Z")


def test_a_name_two_voices_share_must_be_given_by_id(tmp_path: Path) -> None:
    """resolve() of a shared name raises LookupError listing both ids; unknown gives None."""
    store = VoiceStore(tmp_path, max_voices=4)
    a, b = store.add("Sam", _samples(), 16000, None), store.add("Sam", _samples(), 16000, None)
    with pytest.raises(LookupError) as info:
        store.resolve("Sam")
    assert a.id in str(info.value) and b.id in str(info.value)
    assert store.resolve("nobody") is None


def test_delete_removes_row_and_file(tmp_path: Path) -> None:
    """delete() drops the voice from memory, the index and the disk; a second delete is False."""
    store = VoiceStore(tmp_path, max_voices=4)
    rec = store.add("Alice", _samples(), 16000, None)
    assert store.delete(rec.id) and not store.delete(rec.id)
    assert _files(store) == set() and store.get(rec.id) is None
    rows = sqlite3.connect(store.index_path).execute("SELECT count(*) FROM voices").fetchone()
    assert rows == (0,)


def test_max_voices_is_enforced(tmp_path: Path) -> None:
    """Past max_voices, add() raises VoiceStoreFull and writes nothing."""
    store = VoiceStore(tmp_path, max_voices=1)
    store.add("One", _samples(), 16000, None)
    with pytest.raises(VoiceStoreFull):
        store.add("Two", _samples(), 16000, None)
    assert len(_files(store)) == 1 and len(store) == 1


def test_a_failing_index_write_leaves_no_file_and_no_row(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """If the SQLite insert fails after the WAV was renamed into place, the WAV is removed."""
    store = VoiceStore(tmp_path, max_voices=4)
    store.add("Kept", _samples(), 16000, None)

    def broken(db: sqlite3.Connection) -> object:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(voice_store, "_transaction", broken)
    with pytest.raises(sqlite3.OperationalError):
        store.add("Lost", _samples(), 16000, None)
    assert len(_files(store)) == 1 and [r.name for r in store.list()] == ["Kept"]


def test_open_sweeps_what_a_crash_left(tmp_path: Path) -> None:
    """Temporary uploads, WAVs with no row and rows with no file are removed at open."""
    store = VoiceStore(tmp_path, max_voices=4)
    kept = store.add("Kept", _samples(), 16000, None)
    gone = store.add("Gone", _samples(), 16000, None)
    store.close()
    (store.folder / gone.file).unlink()
    (store.folder / ".upload-abc.wav").write_bytes(b"half")
    (store.folder / "v-orphan.wav").write_bytes(b"no row")
    again = VoiceStore(tmp_path, max_voices=4)
    again.open()
    assert again.list() == [kept] and _files(again) == {kept.file}


def test_default_data_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """$XDG_DATA_HOME/voxgate when set, else ~/.local/share/voxgate."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / "voxgate"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / ".local" / "share" / "voxgate"
