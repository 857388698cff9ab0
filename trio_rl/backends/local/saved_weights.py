"""The requests of an in-process training client that save and load weights, in submission order.

A sampler's folder under ``sampler_weights/`` lives only as long as some
sampling client uses it (it goes when the client is garbage-collected), unless
a state saved under the same name keeps it: so the disk holds the snapshots in
use, not one per step.
"""

from __future__ import annotations

import shutil
import weakref
from pathlib import Path

from trio_rl.backends.local.checkpoint import check_name
from trio_rl.backends.local.jobs import JobQueue
from trio_rl.backends.local.runtime import BackendRuntime
from trio_rl.backends.local.sampler_source import SamplerSource, SamplerT


def _discard_sampler_folder(path: Path, states_saved: set[str]) -> None:
    """Delete a sampler folder no client uses any more, unless a saved state shares its name."""
    if path.name not in states_saved:
        shutil.rmtree(path, ignore_errors=True)


class SavedWeights(SamplerSource[SamplerT]):
    """Sampler snapshots, in-flight publications and saved states, each a job on the client's queue.

    A subclass supplies the model side, run in the worker thread: :meth:`_write_state`,
    :meth:`_read_state`, and :class:`~.sampler_source.SamplerSource`'s.

    Args:
        runtime: the backend's nursery, thread limiter and folders.
    """

    def __init__(self, runtime: BackendRuntime) -> None:
        self._runtime = runtime
        self._jobs = JobQueue(runtime)
        self._states_saved: set[str] = set()

    def _write_state(self, path: Path) -> None:
        raise NotImplementedError

    def _read_state(self, path: Path, with_optimizer: bool) -> None:
        raise NotImplementedError

    async def save_weights_for_sampler(self, name: str, *, inflight: bool = False) -> SamplerT:
        """Snapshot the weights (after every request submitted before) and return a sampler of them.

        The snapshot is also written to ``<log_dir>/sampler_weights/<name>``
        (the client's ``model_path``), which is deleted once no one holds the
        client, unless :meth:`save_state` saved a state of the same name.

        Args:
            name: the folder's name.
            inflight: ``False``: the sampler is pinned to these weights.
                ``True``: they become this client's in-flight weights (version:
                the ``optim_step`` calls so far), which every in-flight sampler
                of it, running requests included, samples from its next decode
                step on (see :mod:`~.inflight`); the returned sampler is one more.

        Raises:
            ValueError: if ``name`` is not a plain file name.
            RuntimeError: if the backend is not entered.
        """
        check_name(name)
        path = self._runtime.log_dir / "sampler_weights" / name

        def save() -> SamplerT:
            client = self._publish(path) if inflight else self._sampler(path)
            weakref.finalize(client, _discard_sampler_folder, path, self._states_saved)
            return client

        return await self._jobs.call(save)

    async def create_sampling_client(self) -> SamplerT:
        """A pinned sampler over the current weights, without writing anything to disk."""
        return await self._jobs.call(lambda: self._sampler(None))

    async def save_state(self, name: str) -> str:
        """Save the weights and Adam's state to ``<log_dir>/checkpoints/<name>``.

        Returns:
            The folder's path, for :meth:`load_state` or the backend's
            ``create_training_client_from_state``.

        Raises:
            ValueError: if ``name`` is not a plain file name.
            RuntimeError: if the backend is not entered.
        """
        check_name(name)
        path = self._runtime.log_dir / "checkpoints" / name

        def save() -> str:
            self._write_state(path)
            self._states_saved.add(name)
            return str(path)

        return await self._jobs.call(save)

    async def load_state(self, path: str, *, with_optimizer: bool = True) -> None:
        """Replace the weights (and, if asked, Adam's state) with a saved state.

        Without the optimizer, Adam restarts from step 0 with zero moments.
        Accumulated gradients are dropped either way.

        Raises:
            FileNotFoundError: if ``path`` is not a checkpoint.
            ValueError: if the checkpoint does not fit this client's model, or
                has no optimizer state and one was asked for.
            RuntimeError: if the backend is not entered.
        """
        await self._jobs.call(lambda: self._read_state(Path(path), with_optimizer))
