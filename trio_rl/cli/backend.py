"""The backend a command line asks for (``--backend``), and the tokenizer its envs use.

With Tinker the tokenizer is known only once :func:`~trio_rl.train` has created the
training client, so envs hold a :class:`LazyTokenizer` that the backend binds then.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Self

from ..async_loss import backend_async_loss
from ..backends.protocol import (
    Backend,
    SamplingClient,
    Tokenizer,
    TrainingClient,
    check_inflight_before_work,
    check_loss_before_work,
)
from ..config import Config
from ..errors import ConfigError

if TYPE_CHECKING:
    from .flags import CommonArgs

_LOCAL_LABEL = Config.__dataclass_fields__["base_model"].default
"""``Config.base_model``'s default: LocalBackend's label, no model Tinker has."""


class LazyTokenizer:
    """A tokenizer known only once the backend has created a training client.

    With Tinker the tokenizer comes from the training client, which :func:`train`
    creates; envs hold this stand-in and use it once rollouts start.
    """

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self._tokenizer = tokenizer

    def bind(self, tokenizer: Tokenizer) -> None:
        """Make ``tokenizer`` the real one."""
        self._tokenizer = tokenizer

    def get(self) -> Tokenizer:
        """The real tokenizer.

        Raises:
            RuntimeError: before a training client exists.
        """
        if self._tokenizer is None:
            raise RuntimeError("the tokenizer is known only once the training client exists")
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        return self.get().encode(text)

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens``."""
        return self.get().decode(tokens)


class _BindTokenizer:
    """Wraps a backend so that each training client it creates binds its tokenizer."""

    def __init__(self, inner: Backend, tokenizer: LazyTokenizer) -> None:
        self._inner = inner
        self._tokenizer = tokenizer

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc, tb)

    async def _bound(self, client: TrainingClient) -> TrainingClient:
        self._tokenizer.bind(await client.get_tokenizer())
        return client

    async def create_training_client(
        self, *, base_model: str, lora_rank: int = 32, seed: int | None = None
    ) -> TrainingClient:
        return await self._bound(
            await self._inner.create_training_client(base_model=base_model, lora_rank=lora_rank, seed=seed)
        )

    async def create_training_client_from_state(self, path: str, *, with_optimizer: bool = True) -> TrainingClient:
        return await self._bound(
            await self._inner.create_training_client_from_state(path, with_optimizer=with_optimizer)
        )

    async def create_sampling_client(self, *, base_model: str, model_path: str | None = None) -> SamplingClient:
        return await self._inner.create_sampling_client(base_model=base_model, model_path=model_path)

    # The optional checks are looked up on the backend train() is given, this wrapper: each
    # passes on the inner backend's, and its errors name that backend, not the wrapper.
    def check_loss_fn(self, loss_fn: str, loss_fn_config: dict[str, float] | None) -> None:
        check_loss_before_work(self._inner, loss_fn, loss_fn_config)

    def check_inflight_weights(self) -> None:
        check_inflight_before_work(self._inner)

    def default_async_loss(self) -> tuple[str, dict[str, float] | None]:
        return backend_async_loss(self._inner)


def make_backend(args: CommonArgs, *, alphabet: str) -> tuple[Backend, LazyTokenizer]:
    """The backend named by ``--backend`` and the tokenizer envs should use.

    Args:
        args: the parsed flags.
        alphabet: for ``local``, the characters of the :class:`CharTokenizer`.

    Returns:
        The (not yet entered) backend and a :class:`LazyTokenizer`: bound at once
        for ``local``, once the training client exists for ``tinker``.

    Raises:
        ConfigError: for an unknown backend, ``tinker`` without ``--model``, or
            ``local`` without the ``local`` extra (torch).
    """
    if args.backend == "local":
        try:
            from ..backends.local import CharTokenizer, LocalBackend, ModelConfig
        except ImportError as error:
            raise ConfigError("backend", f"local needs torch: pip install 'trio_rl[local]' ({error})") from error

        tokenizer = CharTokenizer(alphabet)
        sizes = ModelConfig(
            d_model=args.d_model,
            n_layers=args.n_layers,
            n_heads=args.n_heads,
            d_ff=4 * args.d_model,
            max_seq_len=args.max_seq_len,
        )
        backend = LocalBackend(
            log_dir=args.config.log_path, model_config=sizes, tokenizer=tokenizer, seed=args.config.seed
        )
        return backend, LazyTokenizer(tokenizer)
    if args.backend == "tinker":
        if args.config.base_model == _LOCAL_LABEL:
            raise ConfigError("model", "--backend tinker needs --model <base model name>, e.g. meta-llama/Llama-3.2-1B")
        from ..backends.tinker import TinkerBackend

        lazy = LazyTokenizer()
        return _BindTokenizer(TinkerBackend(base_url=args.base_url), lazy), lazy
    raise ConfigError("backend", f"unknown backend {args.backend!r}; use local or tinker")
