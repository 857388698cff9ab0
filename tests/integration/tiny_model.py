"""Build a tiny, randomly initialised Qwen3 model and tokenizer on disk, offline.

The integration tests need a model that SkyRL's Tinker-API server can load
without touching the Hugging Face hub: a real ``Qwen3ForCausalLM`` architecture
(so the server's JAX Qwen3 implementation serves it) at ~100k parameters (so a
forward/backward on two CPU cores takes milliseconds), and a real byte-level
BPE tokenizer (so the tinker SDK's ``get_tokenizer`` and trio_rl's envs work on
text). Both are built here from a fixed seed and a few training strings.

Usage (from the integration venv)::

    python tests/integration/tiny_model.py /tmp/some/dir/tiny-qwen3

The directory path is later used verbatim as ``base_model``; see
:func:`check_model_path` for the paths the tinker SDK mangles.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

EOS_TOKEN = "<|endoftext|>"
"""End of sequence, also used as padding (as Qwen3 does)."""

SPECIAL_TOKENS = [EOS_TOKEN, "<|im_start|>", "<|im_end|>"]

# The tokenizer is trained on these strings only. They cover what the tests
# encode: arithmetic prompts ("12+7=19"), letters, spaces and punctuation. Any
# other text still tokenizes, byte by byte, because the byte-level alphabet is
# always in the vocabulary.
_TRAINING_TEXT = [
    "0123456789",
    *(f"{a}+{b}={a + b}" for a in range(0, 30, 3) for b in range(0, 20, 4)),
    *(f"What is {a} + {b}? Answer: {a + b}" for a in range(10) for b in range(0, 10, 3)),
    "the quick brown fox jumps over the lazy dog",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "Question: count the letters. Answer: yes no true false",
    "hello world, this is a tiny model for tests.",
]

VOCAB_SIZE_TARGET = 384
"""The BPE trainer stops merging here: 256 byte tokens + specials + ~125 merges."""


@dataclass(frozen=True)
class TinyModel:
    """What :func:`build_tiny_model` wrote.

    Attributes:
        path: the model directory, as the string to pass as ``base_model``.
        vocab_size: rows of the embedding matrix (== the tokenizer's size).
        eos_token_id: id of :data:`EOS_TOKEN`.
        num_parameters: parameter count of the torch model.
    """

    path: str
    vocab_size: int
    eos_token_id: int
    num_parameters: int


def check_model_path(path: str) -> None:
    """Refuse a model path that the tinker SDK would rewrite.

    The SDK's tokenizer loader (``_load_tokenizer_from_model_info`` in
    tinker 0.24) cuts the name at the first ``:`` and reads ``a/b/c`` (exactly
    two ``/``) as ``org/model/variant``, loading ``a/b`` instead. The server
    would still train the right model, but ``get_tokenizer`` would fail or,
    worse, load another tokenizer. Deeper (or shallower) paths are safe.

    Raises:
        ValueError: if ``path`` has exactly two ``/`` or contains ``:``.
    """
    if path.count("/") == 2:
        raise ValueError(
            f"model path {path!r} has exactly two '/': the tinker SDK would load the tokenizer "
            "from the first two components; use a path one folder deeper"
        )
    if ":" in path:
        raise ValueError(f"model path {path!r} contains ':', where the tinker SDK cuts model names")


def build_tokenizer(out_dir: Path) -> int:
    """Train the byte-level BPE tokenizer and save it into ``out_dir``.

    Returns:
        The vocabulary size, special tokens included.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Byte level with GPT-2 style pre-splitting: digits group together and every
    # byte sequence stays encodable, like Qwen's own tokenizer.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE_TARGET,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_TRAINING_TEXT, trainer)

    # Wrapping it writes tokenizer.json plus the tokenizer_config.json that
    # AutoTokenizer (the server's and the SDK's loader) needs.
    wrapped = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN
    )
    wrapped.save_pretrained(str(out_dir))
    return int(tokenizer.get_vocab_size(with_added_tokens=True))


def build_tiny_model(out_dir: Path | str, *, seed: int = 0, initializer_range: float = 0.02) -> TinyModel:
    """Write a random ``Qwen3ForCausalLM`` and its tokenizer into ``out_dir``.

    Deterministic for a given ``seed``. Nothing is downloaded.

    Args:
        out_dir: the model directory (created). Its string form is what clients
            pass as ``base_model``, so it must pass :func:`check_model_path`.
        seed: torch seed for the random weights.
        initializer_range: std of the random weights (the config's default, 0.02,
            gives near-uniform next-token distributions; the HF backend's
            learning test uses a larger one so that a LoRA adapter can move them).

    Returns:
        A :class:`TinyModel` describing what was written.

    Raises:
        ValueError: if the path would be mangled by the SDK.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = str(out_dir)
    check_model_path(path)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)

    vocab_size = build_tokenizer(out)
    with open(out / "tokenizer.json", encoding="utf-8") as f:
        eos_token_id = json.load(f)["model"]["vocab"][EOS_TOKEN]

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
        dtype="float32",
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)  # type: ignore[no-untyped-call, unused-ignore]  # typed or not by the environment
    model.save_pretrained(path)  # safetensors (the server's JAX loader reads *.safetensors)
    return TinyModel(
        path=path,
        vocab_size=vocab_size,
        eos_token_id=eos_token_id,
        num_parameters=sum(p.numel() for p in model.parameters()),
    )


def main(argv: list[str] | None = None) -> int:
    """CLI: build the model into the directory given as the only argument."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="model directory to create (its path must not contain exactly two '/')")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        model = build_tiny_model(args.out_dir, seed=args.seed)
    except ValueError as exc:
        print(f"tiny_model: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(model.__dict__))
    return 0


if __name__ == "__main__":
    sys.exit(main())
