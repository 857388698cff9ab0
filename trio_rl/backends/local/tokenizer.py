"""A character-level tokenizer with bos/eos/pad specials, saved as JSON.

It also has the part of the Hugging Face tokenizer interface that
tinker-cookbook's renderers use (``name_or_path``, ``bos_token``,
``encode(text, add_special_tokens=...)``, ...), so
``get_renderer("role_colon", backend.get_tokenizer())`` works on it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

_SPECIALS = ("<pad>", "<bos>", "<eos>")
_SPECIAL_PATTERN = re.compile("|".join(re.escape(t) for t in _SPECIALS))


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
    pad_token = _SPECIALS[0]
    bos_token = _SPECIALS[1]
    eos_token = _SPECIALS[2]
    name_or_path = "trio-rl/char-tokenizer"
    """What Hugging Face tokenizers call their model name; renderers record it."""

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

    def encode(self, text: str, add_special_tokens: bool = False, **_hf_options: Any) -> list[int]:
        """Turn ``text`` into token ids, one per character.

        The specials' own spellings (``<bos>``, ``<eos>``, ``<pad>``) in ``text``
        become their single ids, as in a Hugging Face tokenizer; renderers rely
        on ``encode(bos_token)`` giving the bos id.

        Args:
            text: what to encode.
            add_special_tokens: prepend the bos id.
            _hf_options: other Hugging Face options, accepted and ignored.

        Raises:
            ValueError: if ``text`` has a character outside the alphabet.
        """
        ids: list[int] = [self.bos_token_id] if add_special_tokens else []
        position = 0
        for match in _SPECIAL_PATTERN.finditer(text) if "<" in text else ():
            ids.extend(self._encode_plain(text[position : match.start()]))
            ids.append(_SPECIALS.index(match.group()))
            position = match.end()
        ids.extend(self._encode_plain(text[position:]))
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        try:
            return [self._ids[ch] for ch in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the tokenizer's alphabet") from None

    def decode(self, tokens: Sequence[int], skip_special_tokens: bool = True, **_hf_options: Any) -> str:
        """Turn token ids back into text.

        Args:
            tokens: the ids.
            skip_special_tokens: special tokens decode to nothing (the default);
                with False they decode to their spellings.
            _hf_options: other Hugging Face options, accepted and ignored.

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
            elif not skip_special_tokens:
                out.append(_SPECIALS[tok])
        return "".join(out)

    def __len__(self) -> int:
        return self.vocab_size

    def get_vocab(self) -> dict[str, int]:
        """Token spellings to ids, specials included (the Hugging Face method)."""
        return {**{t: i for i, t in enumerate(_SPECIALS)}, **self._ids}

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        """The spelling of one id, or of each id (the Hugging Face method)."""
        if isinstance(ids, int):
            return self.decode([ids], skip_special_tokens=False)
        return [self.decode([i], skip_special_tokens=False) for i in ids]

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
