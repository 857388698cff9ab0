"""In-flight weights in a decoding batch: swapped in between decode steps, for running rows too.

An in-flight engine serves every in-flight sampling client of one training
client. :meth:`InflightBatch.publish` hands it newer weights; since it runs
under the backend's thread limiter, as every decode step does, the swap falls
between two steps: every running row reads the new weights from its next token
on, and every request admitted after starts on them. The old weights are
released at once. Running rows keep the keys and values computed under older
weights (as Tinker's in-flight sampling does), or, with ``recompute_kv``,
recompute them under the new weights in one prefill pass at the next step, so
that each token's logprob is exactly that of a fresh forward pass of the
weights that produced it. The prefix cache is emptied at each publish: a
prefill is served only under the weights that computed it.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import torch

from trio_rl.backends.local.decode_batch import DecodeBatch
from trio_rl.backends.local.prefix_cache import DEFAULT_MAX_BYTES

W = TypeVar("W")


class InflightBatch(DecodeBatch, Generic[W]):
    """A decoding batch whose weights, if it is in-flight, :meth:`publish` replaces between steps.

    Args:
        prefix_cache_bytes: bound of the cache of prefilled prompts.
        inflight: whether it adopts published weights (and reports each token's version).
        version: the version of its first weights (optimizer steps taken).
        recompute_kv: recompute the running rows' keys and values after a publish.
    """

    def __init__(
        self,
        prefix_cache_bytes: int = DEFAULT_MAX_BYTES,
        *,
        inflight: bool = False,
        version: int = 0,
        recompute_kv: bool = False,
    ) -> None:
        super().__init__(prefix_cache_bytes, version=version)
        self._inflight = inflight
        self._recompute_kv = recompute_kv
        self._kv_stale = False  # the weights changed since the running rows' keys and values were computed

    @property
    def inflight(self) -> bool:
        """Whether it adopts published weights (and reports each token's version)."""
        return self._inflight

    def _use_weights(self, weights: W) -> None:
        """Make ``weights`` the ones every later forward pass reads (worker thread, under the limiter)."""
        raise NotImplementedError

    def publish(self, weights: W, version: int) -> None:
        """Sample from ``weights`` from the next decode step on: running rows, queued and later requests.

        Call it in a worker thread under the backend's thread limiter, as every
        torch job: no decode step runs meanwhile, so the swap falls between two
        steps. The previous weights are released, and the prefix cache, filled
        under them, is cleared.

        Raises:
            RuntimeError: if this is a snapshot engine.
        """
        if not self._inflight:
            raise RuntimeError("a snapshot sampling engine's weights never change")
        self._use_weights(weights)
        self.version = version
        self._prefixes.clear()
        self._kv_stale = self._recompute_kv

    def _refresh_cache(self) -> None:
        """With ``recompute_kv``, rebuild the running rows' cache under the weights published since, one prefill."""
        if not self._kv_stale:
            return
        self._kv_stale = False
        rows = self._rows
        if not rows:
            return
        # A row's cache holds its prompt and its tokens but the last, which the next decode feeds.
        prefills = self._prefill_prompts([[*row.request.prompt, *row.tokens[:-1]] for row in rows])
        self._clear_rows()
        self._append_rows(prefills, [1] * len(rows))
        self._feed_tokens(torch.tensor([row.tokens[-1] for row in rows]))
