"""A tiny byte-level BPE in the Qwen2 layout, with Qwen3-TTS's special tokens at their real ids.

Trained locally (no download) on a small corpus; the vocabulary is padded with unreachable
filler entries up to 151,643 so that ``<|endoftext|>`` .. ``<|im_end|>`` (151643-151645) and
``<tts_pad>`` / ``<tts_text_bos>`` / ``<tts_text_eod>`` (151671-151673) sit at their real ids.
Imported by the tests and by the reference script (another venv): it needs only ``tokenizers``.
"""

from __future__ import annotations

SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = [
    "Hello world, this is a small test of the streaming speech gateway.",
    "The quick brown fox jumps over the lazy dog; it's 2026 and we're testing 123,456.78 numbers!",
    "Don't stop: they'll say you've won, I'm sure he'd agree. Isn't it great?",
    "Ünïcödé text — café, naïve, façade, 東京, 你好世界, こんにちは, 안녕하세요, Привет мир.",
    "assistant\nuser\nSpeak warmly and slowly, with a smile.",
    "Numbers like 3.14159, 42, 1,000,000 and dates 2024-01-15 appear often... Really?!",
]
SPECIAL = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>",
           151671: "<tts_pad>", 151672: "<tts_text_bos>", 151673: "<tts_text_eod>"}


def build(vocab_size: int = 800):
    """A ``tokenizers.Tokenizer`` (NFC, Qwen2 split + byte-level, BPE) with the special ids above."""
    import json

    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    def fresh(model):
        tok = Tokenizer(model)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
        tok.decoder = decoders.ByteLevel()
        return tok

    tok = fresh(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = dict(model["vocab"])
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    n = len(vocab)
    for i in range(n, 151643):
        vocab[f"<|filler_{i}|>"] = i  # no merge produces these: unreachable
    tok = fresh(models.BPE(vocab=vocab, merges=merges))
    for i in range(151643, 151674):
        content = SPECIAL.get(i, f"<|extra_{i}|>")
        tok.add_special_tokens([AddedToken(content, special=True, normalized=False)])
    for i, content in SPECIAL.items():
        assert tok.token_to_id(content) == i, (content, tok.token_to_id(content))
    return tok
