"""An ordered queue of blocking torch jobs, run one at a time in a worker thread.

Every request of a training client (``forward_backward``, ``optim_step``, saves
and loads) becomes a job on its FIFO queue, and one worker task (started in the
backend's nursery when work arrives, gone when the queue is empty) runs the jobs
one by one in a worker thread. So requests execute in submission order however
their results are awaited, and a cancelled wait for a result leaves the queue
intact: the job still runs, as on the Tinker service where a submitted request
is not taken back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import trio

from trio_rl.backends.local.runtime import BackendRuntime

T = TypeVar("T")


@dataclass(eq=False)
class Job:
    """One queued call and, once it ran, its value or error."""

    run: Callable[[], Any]
    done: trio.Event = field(default_factory=trio.Event)
    value: Any = None
    error: BaseException | None = None


class LocalPendingResult(Generic[T]):
    """A request submitted to a local training client; :meth:`result` waits for it."""

    def __init__(self, job: Job) -> None:
        self._job = job

    async def result(self) -> T:
        """Wait until the request has run and return its answer.

        Cancelling this wait does not withdraw the request (it keeps its place in
        the queue and still runs), so later requests see the state it leaves.
        It may be awaited again, or by several tasks.

        Raises:
            Exception: whatever the request raised.
            RuntimeError: if the backend closed before the request finished.
        """
        await self._job.done.wait()
        if self._job.error is not None:
            raise self._job.error
        return self._job.value  # type: ignore[no-any-return]


class JobQueue:
    """The FIFO of one training client; its worker task lives in the backend's nursery.

    Args:
        runtime: the backend's nursery and thread limiter.
    """

    def __init__(self, runtime: BackendRuntime) -> None:
        self._runtime = runtime
        self._queue: deque[Job] = deque()
        self._working = False

    def submit(self, run: Callable[[], T]) -> LocalPendingResult[T]:
        """Queue ``run`` (a blocking function) behind everything submitted before.

        Raises:
            RuntimeError: if the backend is not entered.
        """
        self._runtime.require_entered()
        job = Job(run)
        if not self._working:
            self._runtime.spawn(self._work)
            self._working = True
        self._queue.append(job)
        return LocalPendingResult(job)

    async def call(self, run: Callable[[], T]) -> T:
        """Queue ``run`` and wait for its value."""
        return await self.submit(run).result()

    async def _work(self) -> None:
        try:
            while self._queue:
                job = self._queue[0]
                try:
                    job.value = await trio.to_thread.run_sync(job.run, limiter=self._runtime.limiter)
                except trio.Cancelled:
                    raise
                except Exception as exc:
                    job.error = exc
                self._queue.popleft()
                job.done.set()
        finally:
            self._working = False
            closed = RuntimeError("the backend was closed before this request finished")
            for job in self._queue:
                job.error = closed
                job.done.set()
            self._queue.clear()
