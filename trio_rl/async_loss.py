"""The loss an async run trains when ``AsyncConfig.loss_fn`` is left at ``None``: each backend's own.

tinker-cookbook 0.6.1 trains ``"stable_reinforce"`` in async mode, a loss of the
Tinker service that the in-process backends do not have. So, as
``rollout_error_tolerance=None`` is resolved per model, ``AsyncConfig.loss_fn=None``
is resolved per backend before any work: a backend names its default with a
``default_async_loss()`` method; one without it trains the cookbook's
``"stable_reinforce"``: TinkerBackend and any other Tinker-compatible service,
and FakeBackend, which computes no loss and stands in for the service in the
schedule tests (they cover the data that loss needs, its provenance spans).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import Config

COOKBOOK_ASYNC_LOSS = "stable_reinforce"
"""tinker-cookbook 0.6.1's ``AsyncConfig.loss_fn`` default, for backends that name none of their own."""


def backend_async_loss(backend: object) -> tuple[str, dict[str, float] | None]:
    """The loss and ``loss_fn_config`` ``backend`` trains async runs with by default.

    Args:
        backend: any backend; its ``default_async_loss()``, where it has one, decides.

    Returns:
        ``(loss_fn, loss_fn_config)``: the backend's, else ``("stable_reinforce", None)``.
    """
    method: Callable[[], tuple[str, dict[str, float] | None]] | None = getattr(backend, "default_async_loss", None)
    if method is None:
        return COOKBOOK_ASYNC_LOSS, None
    loss_fn, loss_fn_config = method()
    return loss_fn, None if loss_fn_config is None else dict(loss_fn_config)


def with_async_loss(config: Config, backend: object) -> Config:
    """``config`` with ``AsyncConfig.loss_fn=None`` replaced by ``backend``'s default (unchanged otherwise).

    The default's ``loss_fn_config`` applies only where ``Config.loss_fn_config``
    is ``None``: parameters the user gave are kept, and checked against the
    resolved loss like any other.
    """
    if config.async_config is None or config.async_config.loss_fn is not None:
        return config
    loss_fn, loss_fn_config = backend_async_loss(backend)
    return dataclasses.replace(
        config,
        async_config=dataclasses.replace(config.async_config, loss_fn=loss_fn),
        loss_fn_config=config.loss_fn_config if config.loss_fn_config is not None else loss_fn_config,
    )
