"""CharTokenizer: ids, specials, JSON round trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_rl.backends.local import CharTokenizer

ALPHABET = "abc xyz"


@given(st.text(alphabet=ALPHABET))
def test_encode_decode_round_trip(text: str) -> None:
    tok = CharTokenizer(ALPHABET)
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert all(3 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


def test_specials_and_errors() -> None:
    tok = CharTokenizer(ALPHABET)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.vocab_size == 3 + len(ALPHABET)
    assert tok.decode([tok.bos_token_id, *tok.encode("ab"), tok.eos_token_id]) == "ab"
    with pytest.raises(ValueError):
        tok.encode("Q")
    with pytest.raises(ValueError):
        tok.decode([tok.vocab_size])
    with pytest.raises(ValueError):
        CharTokenizer("aa")
    with pytest.raises(ValueError):
        CharTokenizer("")


def test_json_round_trip() -> None:
    tok = CharTokenizer(ALPHABET)
    assert CharTokenizer.from_json(tok.to_json()) == tok
    with pytest.raises(ValueError):
        CharTokenizer.from_json('{"type": "Other"}')
