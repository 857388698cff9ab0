"""A SkyRL server killed with SIGKILL in the middle of a step, then restarted on the same port.

What the tinker SDK (0.24.1) does when its server dies: it retries without end.
A wait on a request's result polls ``retrieve_future``; a refused connection is
retried with a backoff capped at 30 s, and an HTTP 5xx at once, with no limit
(``tinker/lib/api_future_impl.py``: ``_result_async`` and
``_handle_transport_error``). A killed server also loses what its engine held in
memory (the LoRA adapters and the requests in flight), so a restarted one never
answers those requests. The SDK alone would wait forever: trio_rl's per-call
deadlines (``TinkerTimeouts``) are what end the run, with a
``RemoteTimeoutError`` naming the server.

Then ``resume`` against the restarted server continues from the last checkpoint
(its files are on the server's disk), and every step is trained exactly once.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import trio
from skyrl_server import SkyRLServer
from test_skyrl_pipeline import (
    GROUPS_PER_BATCH,
    RUN_DEADLINE_S,
    ArithmeticDataset,
    leaf_exceptions,
    make_backend,
    make_config,
    read_jsonl,
    run_training,
    server_tokenizer,
    train_records,
)

import trio_rl
from trio_rl.backends.tinker import RemoteTimeoutError, TinkerTimeouts
from trio_rl.loop.checkpoints import CheckpointLog

# Last in the session (see conftest.py): no other test meets the restarted server.
pytestmark = [pytest.mark.integration, pytest.mark.kills_server]

DEADLINE_S = 20.0
"""Each remote wait's deadline in the run that loses its server (first calls include a JAX compile, ~10 s)."""

NUM_BATCHES = 4


async def wait_for_checkpoint(log_path: Path, step: int) -> None:
    """Until ``checkpoints.jsonl`` has a row for ``step`` (the trainer writes it after the step's record)."""
    # Polled: the row is the trainer's own, with no event to wait on.
    while (last := CheckpointLog(log_path).last()) is None or last.step < step:  # noqa: ASYNC110
        await trio.sleep(0.05)


async def test_a_server_killed_mid_step_ends_the_run_and_resume_trains_every_step_once(
    skyrl_server: SkyRLServer, tmp_path: Path
) -> None:
    tokenizer = await server_tokenizer(skyrl_server)
    log_path = tmp_path / "killed"
    timeouts = TinkerTimeouts(
        create_training_client=120,
        forward_backward=DEADLINE_S,
        optim_step=DEADLINE_S,
        sample=DEADLINE_S,
        checkpoint=DEADLINE_S,
        tokenizer=60,
        close=10,
    )
    backend = make_backend(skyrl_server, timeouts)
    config = make_config(skyrl_server, log_path, save_every=1)
    dataset = ArithmeticDataset(tokenizer, skyrl_server.eos_token_id, num_batches=NUM_BATCHES)

    with pytest.raises(BaseExceptionGroup) as caught:
        with trio.fail_after(RUN_DEADLINE_S):
            async with backend, trio.open_nursery() as nursery:
                run = functools.partial(trio_rl.train, config, dataset=dataset, backend=backend)
                handle = await nursery.start(run)
                async for record in handle.metrics:
                    if "progress/groups" in record and record["step"] == 1:
                        break
                # Steps 0 and 1 are trained and saved; step 2's groups are sampling.
                await wait_for_checkpoint(log_path, 2)
                skyrl_server.kill()
                killed_at = trio.current_time()
    failed_after = trio.current_time() - killed_at

    # Bounded: one deadline after the kill (plus closing the session), never RUN_DEADLINE_S.
    assert failed_after < DEADLINE_S + 20, f"the run took {failed_after:.0f} s to fail"
    leaves = list(leaf_exceptions(caught.value))
    assert leaves and all(isinstance(e, RemoteTimeoutError) for e in leaves), leaves
    for error in leaves:
        assert isinstance(error, RemoteTimeoutError) and error.server == skyrl_server.base_url
        assert f"on the Tinker server at {skyrl_server.base_url}" in str(error)
    print(f"killed mid-step: the run ended {failed_after:.1f} s later with {leaves!r}")
    saved = CheckpointLog(log_path).last()
    assert saved is not None and saved.step == 2

    skyrl_server.restart()  # on this thread: the server is stopped when the thread that started it exits
    resumed_backend = make_backend(skyrl_server)
    second = await run_training(
        make_config(skyrl_server, log_path, save_every=1, resume=True),
        ArithmeticDataset(tokenizer, skyrl_server.eos_token_id, num_batches=NUM_BATCHES),
        resumed_backend,
    )

    # From the last checkpoint, its state path, optimizer included.
    assert resumed_backend.created == [("from_state", (saved.state_path, True))]
    assert second.first_step == 2 and second.final_step == NUM_BATCHES
    # Every step trained exactly once: one training record per step, none missing.
    steps_on_disk = [r["step"] for r in train_records(read_jsonl(log_path / "metrics.jsonl"))]
    assert steps_on_disk == list(range(NUM_BATCHES))
    # Run counts carry across a resume: the whole run's groups, each trained once.
    assert second.trained_groups == NUM_BATCHES * GROUPS_PER_BATCH
