"""A small Llama-style tokenizer for the tiny VoxCPM2 checkpoints, trained locally.

The real one (MiniCPM4's, 73,448 ids) cannot be downloaded here. This one has the same shape:
a SentencePiece-style BPE (``▁`` word marker, byte fallback ``<0xNN>``) with ``<unk>`` 0, ``<s>``
1, ``</s>`` 2 and VoxCPM2's audio ids at their real places (101 audio start, 102 audio end, 103
reference start, 104 reference end), fillers between them, and multi-character Chinese tokens
in the vocabulary so the reference's character split is exercised.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = {0: "<unk>", 1: "<s>", 2: "</s>", 101: "<|audio_start|>", 102: "<|audio_end|>",
            103: "<|ref_audio_start|>", 104: "<|ref_audio_end|>"}

_CORPUS = [
    "Hello world, this is a tiny tokenizer for the VoxCPM two tests.",
    "The quick brown fox jumps over the lazy dog. It's 2026!",
    "Really? Yes, really. Don't stop: three point one four.",
    "你好世界，你好中国。世界很大，中国很美。你好你好世界世界中国中国。",
    "我们今天说中文，也说 English, mixed together.",
] * 4


def build(vocab_size: int = 480) -> Tokenizer:
    fixed = [SPECIALS.get(i, f"<unused_{i}>") for i in range(105)]
    fixed += [f"<0x{b:02X}>" for b in range(256)]
    pre = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.pre_tokenizer = pre
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[], show_progress=False,
                                  min_frequency=2)
    trainer_tok.train_from_iterator(_CORPUS, trainer)
    learned = trainer_tok.get_vocab()
    vocab = {t: i for i, t in enumerate(fixed)}
    for t, _ in sorted(learned.items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = _merges(trainer_tok)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.pre_tokenizer = pre
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1)])
    tok.add_special_tokens([AddedToken(SPECIALS[i], special=True, normalized=False) for i in sorted(SPECIALS)])
    return tok


def _merges(tok: Tokenizer) -> list[tuple[str, str]]:
    import json

    model = json.loads(tok.to_str())["model"]
    return [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
