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


def test_hugging_face_interface_that_renderers_use() -> None:
    tok = CharTokenizer("ab<>")
    assert tok.name_or_path and (tok.bos_token, tok.eos_token, tok.pad_token) == ("<bos>", "<eos>", "<pad>")
    # A special's spelling encodes to its id (renderers encode bos_token); lone brackets stay characters.
    assert tok.encode(tok.bos_token, add_special_tokens=False) == [tok.bos_token_id]
    assert tok.encode("a<eos>b<", add_special_tokens=False) == [3, tok.eos_token_id, 4, 5]
    assert tok.encode("ab", add_special_tokens=True) == [tok.bos_token_id, 3, 4]
    assert tok.decode([1, 3, 2]) == "a"
    assert tok.decode([1, 3, 2], skip_special_tokens=False) == "<bos>a<eos>"
    assert len(tok) == tok.vocab_size == 7
    assert tok.get_vocab()["<eos>"] == 2 and tok.convert_ids_to_tokens([2, 4]) == ["<eos>", "b"]
