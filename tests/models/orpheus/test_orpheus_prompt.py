"""Prompt layout, option validation and the token <-> code mapping."""

from __future__ import annotations

import pytest
import torch
from tests.models.orpheus.orpheus_fixtures import BOS, VOICE_IDS, WORD_IDS, build_tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.backend import OptionError
from models.orpheus.loader import PieceTokenizer
from models.orpheus.prompt import DEFAULT_OPTIONS, STOP_ID, VOICES, build_prompt_ids, validate_options
from models.orpheus.tokens import (
    audio_token_ids, code_to_token, codes_to_tokens, token_to_code, tokens_to_codes,
)


def test_prompt_ids_exactly_as_specified():
    """[128259] + BOS + ids of "tara: hello world!" + [128009, 128260, 128261, 128257]."""
    ids = build_prompt_ids(build_tokenizer(), "tara", "hello world!")
    words = [VOICE_IDS["tara"], WORD_IDS[":"], WORD_IDS["hello"], WORD_IDS["world"], WORD_IDS["!"]]
    assert ids == [128259, BOS, *words, 128009, 128260, 128261, 128257]


def test_prompt_prepends_bos_when_tokenizer_does_not():
    """A tokenizer without a BOS post-processor still yields BOS after START_OF_HUMAN."""

    class NoBos:
        bos_token_id = 7

        def encode(self, text):
            return [1, 2]

    assert build_prompt_ids(NoBos(), "leo", "x") == [128259, 7, 1, 2, 128009, 128260, 128261, 128257]


def test_dummy_tokenizer_prompt_has_the_layout_with_one_id_per_piece():
    """With the dummy tokenizer the prompt is the usual layout around BOS + one id per piece
    of "zoe: a" (zoe, :, " a")."""
    tok = PieceTokenizer()
    ids = build_prompt_ids(tok, "zoe", "a")
    assert ids[:2] == [128259, 128000] and ids[-4:] == [128009, 128260, 128261, 128257]
    assert ids[2:-4] == tok.encode("zoe: a")[1:] and len(ids) == 2 + 3 + 4


def test_defaults_filled_in():
    """No voice and no options gives tara with temperature 0.6, top_p 0.8, penalty 1.3."""
    voice, opts = validate_options(None, {})
    assert voice == "tara"
    assert opts == DEFAULT_OPTIONS
    assert (opts["temperature"], opts["top_p"], opts["repetition_penalty"]) == (0.6, 0.8, 1.3)


def test_unknown_voice_lists_voices():
    """An unknown voice raises OptionError whose message lists all eight voices."""
    with pytest.raises(OptionError) as e:
        validate_options("bob", {})
    assert e.value.code == "unknown_voice"
    assert all(v in str(e.value) for v in VOICES)


@pytest.mark.parametrize("field,value,range_text", [
    ("temperature", 2.5, "[0, 2]"),
    ("temperature", -0.1, "[0, 2]"),
    ("top_p", 0.0, "(0, 1]"),
    ("top_p", 1.01, "(0, 1]"),
    ("repetition_penalty", 0.9, "[1, 2]"),
    ("max_tokens", 6, "[7, 8192]"),
    ("max_tokens", 8193, "[7, 8192]"),
    ("max_tokens", 10.5, "[7, 8192]"),
    ("temperature", "hot", "[0, 2]"),
    ("temperature", float("nan"), "[0, 2]"),
])
def test_out_of_range_option_names_field_and_range(field, value, range_text):
    """A bad sampling value raises OptionError naming the field and its range."""
    with pytest.raises(OptionError) as e:
        validate_options("leah", {field: value})
    assert e.value.code == "invalid_option"
    assert field in str(e.value) and range_text in str(e.value)


def test_valid_overrides_and_seed():
    """In-range overrides (greedy temperature 0, top_p 1, a seed) are accepted and normalised."""
    _, opts = validate_options("mia", {"temperature": 0, "top_p": 1, "seed": 42, "max_tokens": 7})
    assert opts["temperature"] == 0.0 and isinstance(opts["temperature"], float)
    assert (opts["top_p"], opts["seed"], opts["max_tokens"]) == (1.0, 42, 7)
    with pytest.raises(OptionError, match="seed"):
        validate_options("mia", {"seed": "x"})
    with pytest.raises(OptionError, match="speed"):
        validate_options("mia", {"speed": 2})


def test_token_code_mapping_formula():
    """The k-th audio token maps to id - 128266 - 4096 * (k mod 7)."""
    assert token_to_code(128266, 0) == 0
    assert token_to_code(128266 + 4096 * 3 + 17, 10) == 17  # 10 mod 7 == 3
    assert token_to_code(128266 + 5, 1) is None  # slot 1 starts at 128266 + 4096
    assert code_to_token(17, 10) == 128266 + 4096 * 3 + 17


def test_frame_positions_feed_codebooks():
    """Positions (0), (1, 4), (2, 3, 5, 6) of a frame go to codebooks 0, 1, 2 in that order."""
    codes = [100, 101, 102, 103, 104, 105, 106]
    c0, c1, c2 = tokens_to_codes([code_to_token(c, k) for k, c in enumerate(codes)])
    assert c0.tolist() == [[100]]
    assert c1.tolist() == [[101, 104]]
    assert c2.tolist() == [[102, 103, 105, 106]]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4095), min_size=7, max_size=7), min_size=1, max_size=12))
def test_tokens_codes_round_trip(frames):
    """tokens -> codes -> tokens is the identity for any whole frames of valid tokens."""
    tokens = [code_to_token(c, k) for k, c in enumerate(x for f in frames for x in f)]
    c0, c1, c2 = tokens_to_codes(tokens)
    n = len(frames)
    assert c0.shape == (1, n) and c1.shape == (1, 2 * n) and c2.shape == (1, 4 * n)
    assert codes_to_tokens(c0, c1, c2) == tokens


def test_invalid_tokens_raise_with_index():
    """A partial frame or a token outside its slot's range raises ValueError naming the index."""
    good = [code_to_token(0, k) for k in range(7)]
    with pytest.raises(ValueError, match="whole frames"):
        tokens_to_codes(good[:6])
    bad = good.copy()
    bad[3] = STOP_ID
    with pytest.raises(ValueError, match="index 3"):
        tokens_to_codes(bad)


def test_audio_token_ids_cover_audio_range_and_stop():
    """audio_token_ids() is the 28,672 audio ids followed by the stop id."""
    ids = audio_token_ids()
    assert ids.shape == (28673,) and ids.dtype == torch.long
    assert ids[0] == 128266 and ids[-2] == 128266 + 28671 and ids[-1] == STOP_ID
