"""A tiny byte-level BPE in the Llama 3 layout, with CSM's special tokens at their real ids.

Trained locally (no download) on a small corpus; the vocabulary is padded with unreachable
fillers up to 128,000 so that the 256 special tokens sit at 128000-128255 as in Llama 3:
``<|begin_of_text|>`` 128000, ``<|end_of_text|>`` 128001, and CSM's ``<|AUDIO|>`` 128002 and
``<|audio_eos|>`` 128003 (two of Llama 3's reserved tokens, renamed in ``sesame/csm-1b``'s
tokenizer). The post-processor wraps a text in bos ... eos, as CSM's tokenizer does. Imported
by the tests and by the reference script (another venv): it needs only ``tokenizers``.
"""

from __future__ import annotations

# Llama 3's pre-tokenizer split (digits in groups of up to three)
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = [
    "Hello world, this is a small test of the streaming speech gateway.",
    "[0]The quick brown fox jumps over the lazy dog; it's 2026 and we're testing 123,456.78 numbers!",
    "[1]Don't stop: they'll say you've won, I'm sure he'd agree. Isn't it great?",
    "Ünïcödé text — café, naïve, façade. [2]Conversation turns, speaker ids [0] [1] [3].",
    "Numbers like 3.14159, 42, 1,000,000 and dates 2024-01-15 appear often... Really?!",
]
SPECIAL = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128002: "<|AUDIO|>", 128003: "<|audio_eos|>"}
NUM_TEXT = 128000
NUM_SPECIAL = 256


def build(vocab_size: int = 700):
    """A ``tokenizers.Tokenizer`` (Llama 3 split + byte-level BPE) with the special ids above."""
    import json

    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    def fresh(model):
        tok = Tokenizer(model)
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
    for i in range(len(vocab), NUM_TEXT):
        vocab[f"<|filler_{i}|>"] = i  # no merge produces these: unreachable
    tok = fresh(models.BPE(vocab=vocab, merges=merges))
    for i in range(NUM_TEXT, NUM_TEXT + NUM_SPECIAL):
        content = SPECIAL.get(i, f"<|reserved_special_token_{i - NUM_TEXT}|>")
        tok.add_special_tokens([AddedToken(content, special=True, normalized=False)])
    for i, content in SPECIAL.items():
        assert tok.token_to_id(content) == i, (content, tok.token_to_id(content))
    bos, eos = SPECIAL[128000], SPECIAL[128001]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0 {eos}:0", pair=f"{bos}:0 $A:0 {eos}:0 {bos}:1 $B:1 {eos}:1",
        special_tokens=[(bos, 128000), (eos, 128001)])
    return tok
