"""Intelligibility scoring for ``voxgate bench --asr`` and the tests: pocketsphinx transcription
(offline, its model ships in the wheel) and the word error rate.

    from benchmark.asr import transcribe, word_error_rate
    wer = word_error_rate("the weather is nice", transcribe(pcm, 24_000))"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Sequence
from math import gcd

import numpy as np

__all__ = [
    "INTELLIGIBILITY_SENTENCES",
    "ASR_SAMPLE_RATE",
    "Transcriber",
    "transcribe",
    "resample",
    "normalize_words",
    "word_error_rate",
]

ASR_SAMPLE_RATE = 16_000
_SILENCE_PEAK = 1e-3  # audio quieter than this everywhere (-60 dBFS) is taken as silence

# Sentences that pocketsphinx transcribes perfectly from hibari's "heart" voice: short common
# words, no numbers or names. Measured WER of each, spoken alone by hibari with seeds 0, 1 and 2:
# 0.00 for every sentence and seed (normalize_words expands "we're" etc.). The first seven and
# the last seven, each pushed word by word through the segmenter as one stream and spoken per
# segment (8 segments, 17-19 s of audio), give 0.000 and 0.048 (seeds 0 and 1).
# Rejected: "Where did you put my keys?" (0.50), "I like to read a good book at night." (0.22),
# "The dog is sleeping on the floor." (0.14).
INTELLIGIBILITY_SENTENCES: tuple[str, ...] = (
    "Hello, how are you today?",
    "I would like a cup of coffee, please.",
    "She has a red car and a small house.",
    "Thank you very much for your help.",
    "The children are playing in the garden.",
    "Please call me when you get home.",
    "It is a good day to go for a walk.",
    "Can you tell me where the nearest bank is?",
    "I think we should go home now.",
    "The weather is nice today and we are going to the park.",
    "We will meet at the station tomorrow morning.",
    "Do you want to go to the store with me?",
    "The sun is shining and the sky is blue.",
    "We had a great time at the beach.",
)

# Contractions the recogniser and the reference may write either way; both sides are expanded.
_CONTRACTIONS = {
    "i'm": "i am",
    "you're": "you are",
    "we're": "we are",
    "they're": "they are",
    "it's": "it is",
    "that's": "that is",
    "there's": "there is",
    "what's": "what is",
    "where's": "where is",
    "who's": "who is",
    "how's": "how is",
    "here's": "here is",
    "how're": "how are",
    "what're": "what are",
    "where're": "where are",
    "he's": "he is",
    "she's": "she is",
    "i'll": "i will",
    "you'll": "you will",
    "we'll": "we will",
    "they'll": "they will",
    "i've": "i have",
    "we've": "we have",
    "you've": "you have",
    "i'd": "i would",
    "we'd": "we would",
    "don't": "do not",
    "doesn't": "does not",
    "didn't": "did not",
    "isn't": "is not",
    "aren't": "are not",
    "wasn't": "was not",
    "can't": "cannot",
    "won't": "will not",
    "let's": "let us",
}
_NON_WORD = re.compile(r"[^a-z0-9']+")


def normalize_words(text: str) -> list[str]:
    """Lowercase words without punctuation, contractions expanded ("We're here." -> we are here)."""
    words: list[str] = []
    for raw in _NON_WORD.split(text.lower().replace("’", "'")):
        word = raw.strip("'")
        if word:
            words.extend(_CONTRACTIONS.get(word, word).split())
    return words


def word_error_rate(reference: str | Sequence[str], hypothesis: str | Sequence[str]) -> float:
    """(substitutions + deletions + insertions) / reference words, over normalised words.

    Strings are normalised with ``normalize_words``; sequences are taken as words already.
    An empty reference gives 0.0 for an empty hypothesis and 1.0 otherwise.
    """
    ref = normalize_words(reference) if isinstance(reference, str) else list(reference)
    hyp = normalize_words(hypothesis) if isinstance(hypothesis, str) else list(hypothesis)
    if not ref:
        return 0.0 if not hyp else 1.0
    # Levenshtein distance over words, one row at a time.
    row = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, start=1):
        prev_diag, row[0] = row[0], i
        for j, hyp_word in enumerate(hyp, start=1):
            cost = prev_diag + (ref_word != hyp_word)
            prev_diag = row[j]
            row[j] = min(cost, row[j] + 1, row[j - 1] + 1)
    return row[-1] / len(ref)


def resample(pcm: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Band-limited rational resampling (zero-stuff, Kaiser-windowed sinc low-pass, decimate).

    Returns float32 of length ceil(len * to_rate / from_rate). NumPy only.
    """
    if from_rate <= 0 or to_rate <= 0:
        raise ValueError(f"sample rates must be > 0, got {from_rate} and {to_rate}")
    x = np.asarray(pcm, dtype=np.float64).reshape(-1)  # [n]
    g = gcd(int(from_rate), int(to_rate))
    up, down = int(to_rate) // g, int(from_rate) // g
    if up == down == 1 or x.size == 0:
        return x.astype(np.float32)
    factor = max(up, down)
    half = 10 * factor  # filter half-length in samples of the upsampled signal
    taps = np.arange(-half, half + 1)  # [2*half+1]
    cutoff = 1.0 / factor  # of the upsampled Nyquist frequency: the lower of the two Nyquists
    h = cutoff * np.sinc(cutoff * taps) * np.kaiser(taps.size, 5.0) * up  # gain `up` undoes stuffing
    stuffed = np.zeros(x.size * up)  # [n*up]
    stuffed[::up] = x
    filtered = _fft_convolve(stuffed, h)[half : half + stuffed.size]  # centred: zero delay
    return filtered[::down].astype(np.float32)  # [ceil(n*up/down)]


def _fft_convolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = a.size + b.size - 1
    size = 1 << (n - 1).bit_length()
    return np.fft.irfft(np.fft.rfft(a, size) * np.fft.rfft(b, size), size)[:n]


class Transcriber:
    """A pocketsphinx decoder with its default US English model (loading takes about a second).

    Not thread-safe: a lock serialises ``transcribe`` calls.
    """

    def __init__(self) -> None:
        from pocketsphinx import Decoder

        self._decoder = Decoder(loglevel="FATAL")
        self._lock = threading.Lock()

    def transcribe(self, pcm: np.ndarray, sample_rate: int) -> str:
        """Float audio in [-1, 1] at any rate -> lowercase words ("" for silence)."""
        audio = resample(pcm, sample_rate, ASR_SAMPLE_RATE)
        if audio.size == 0 or np.abs(audio).max() < _SILENCE_PEAK:
            return ""  # pocketsphinx hallucinates words in digital silence
        pad = np.zeros(ASR_SAMPLE_RATE // 4, np.float32)  # silence either side helps the recogniser
        audio = np.concatenate([pad, audio, pad])
        pcm16 = (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")
        with self._lock:
            self._decoder.start_utt()
            self._decoder.process_raw(pcm16.tobytes(), no_search=False, full_utt=True)
            self._decoder.end_utt()
            hyp = self._decoder.hyp()
        return hyp.hypstr if hyp is not None else ""


@functools.lru_cache(maxsize=1)
def _default_transcriber() -> Transcriber:
    return Transcriber()


def transcribe(pcm: np.ndarray, sample_rate: int) -> str:
    """Transcribe float32 speech with a shared ``Transcriber`` (built on first use)."""
    return _default_transcriber().transcribe(pcm, sample_rate)
