"""A character-level tokenizer with bos/eos/pad specials, saved as JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

_SPECIALS = ("<pad>", "<bos>", "<eos>")


class CharTokenizer:
    """Maps each character of a fixed alphabet to one token id.

    Ids ``0``, ``1`` and ``2`` are the pad, bos and eos specials; the characters of
    ``alphabet`` follow in order, so ``vocab_size == 3 + len(alphabet)``.

    Args:
        alphabet: the characters the tokenizer knows, each once.

    Raises:
        ValueError: if ``alphabet`` is empty or repeats a character.
    """

    pad_token_id = 0
    bos_token_id = 1
    eos_token_id = 2

    def __init__(self, alphabet: str) -> None:
        if not alphabet:
            raise ValueError("alphabet must not be empty")
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("alphabet repeats a character")
        self._alphabet = alphabet
        self._ids = {ch: i + len(_SPECIALS) for i, ch in enumerate(alphabet)}

    @property
    def alphabet(self) -> str:
        """The characters this tokenizer knows, in id order."""
        return self._alphabet

    @property
    def vocab_size(self) -> int:
        """Number of token ids, specials included."""
        return len(_SPECIALS) + len(self._alphabet)

    def encode(self, text: str) -> list[int]:
        """Turn ``text`` into token ids, one per character, with no specials added.

        Raises:
            ValueError: if ``text`` has a character outside the alphabet.
        """
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the tokenizer's alphabet") from None

    def decode(self, tokens: Sequence[int]) -> str:
        """Turn token ids back into text; special tokens decode to nothing.

        Raises:
            ValueError: if an id is outside ``[0, vocab_size)``.
        """
        out: list[str] = []
        for tok in tokens:
            tok = int(tok)
            if not 0 <= tok < self.vocab_size:
                raise ValueError(f"token id {tok} is outside the vocabulary (size {self.vocab_size})")
            if tok >= len(_SPECIALS):
                out.append(self._alphabet[tok - len(_SPECIALS)])
        return "".join(out)

    def to_json(self) -> str:
        """Serialise to JSON (read back with :meth:`from_json`)."""
        return json.dumps({"type": "CharTokenizer", "alphabet": self._alphabet})

    @classmethod
    def from_json(cls, text: str) -> CharTokenizer:
        """Rebuild a tokenizer saved with :meth:`to_json`.

        Raises:
            ValueError: if ``text`` is not a saved ``CharTokenizer``.
        """
        data: Any = json.loads(text)
        if not isinstance(data, dict) or data.get("type") != "CharTokenizer":
            raise ValueError("not a saved CharTokenizer")
        alphabet = data.get("alphabet")
        if not isinstance(alphabet, str):
            raise ValueError("saved CharTokenizer has no alphabet")
        return cls(alphabet)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other._alphabet == self._alphabet

    def __hash__(self) -> int:
        return hash(self._alphabet)

    def __repr__(self) -> str:
        return f"CharTokenizer(alphabet={self._alphabet!r})"
