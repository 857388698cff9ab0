"""Embed a training run in your own Trio program: watch its live metrics and stop it early.

    python examples/embedding.py                      # stop when the reward reaches 0.5, or after 200 steps
    python examples/embedding.py --threshold 0.3 --stop-after 50

``trio_rl.train`` is started with ``nursery.start``, which hands back a
``RunHandle`` as soon as the first weights exist. The host reads every step's
record from ``handle.metrics`` while the run goes on, and stops the run by
cancelling the nursery's scope: rollouts in flight are cancelled, the trainer
saves the last completed step (``save_on_cancel``), and ``train`` returns
control to the host, which prints what it saw. The host also runs a task of its
own (a heartbeat) beside the run, to show that training does not block it.

The environment is the one of ``examples/arithmetic.py``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    # Ctrl-C (or SIGTERM) while the imports below load (torch takes seconds) ends the
    # process at once with 130 (143): nothing has started, and an exception raised
    # here can land in the import machinery, which ignores it and may then hang.
    # Once the run starts, trio_rl.cli handles both signals.
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(143))

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import arithmetic

from trio_rl import CheckpointLog, Config, ConfigError, RunHandle, train
from trio_rl.cli import config_error_leaves, make_backend, make_config, parse_args

CONFIG = dataclasses.replace(
    arithmetic.CONFIG,
    log_path="runs/embedding",
    max_steps=1000,
    eval_every=0,  # the host passes no evaluators: only the final weights' record
)
"""The arithmetic example's configuration, in its own folder and with room for 1000 steps."""


@dataclass
class Args(arithmetic.Args):
    """The arithmetic example's flags, plus when to stop."""

    config: Config = CONFIG
    threshold: float = 0.5
    """stop once a step's mean reward reaches this"""
    stop_after: int = 200
    """stop after this many steps at the latest"""
    heartbeat_s: float = 5.0
    """seconds between the host's own heartbeat lines"""


async def host(args: Args) -> dict[str, Any]:
    """Run training inside this program, watch it, and stop it; return what was seen."""
    backend, tokenizer = make_backend(args, alphabet=arithmetic.ALPHABET)
    renderer = arithmetic.Renderer(tokenizer)
    dataset = arithmetic.AdditionDataset(args, renderer, num_batches=4 * args.config.max_steps + 8)
    config = make_config(args)
    seen: dict[str, Any] = {"steps": 0, "best_reward": 0.0, "stopped_because": "the run ended", "heartbeats": 0}

    async def heartbeat() -> None:
        while True:
            await trio.sleep(args.heartbeat_s)
            seen["heartbeats"] += 1
            print(f"[host] still responsive; {seen['steps']} steps seen so far", flush=True)

    async with backend, trio.open_nursery() as nursery:
        nursery.start_soon(heartbeat)
        handle: RunHandle = await nursery.start(
            lambda task_status: train(config, dataset=dataset, backend=backend, task_status=task_status)
        )
        print(f"[host] run started in {handle.log_path}", flush=True)
        async for record in handle.metrics:
            if "progress/groups" not in record:
                continue
            seen["steps"] = record["step"] + 1
            reward = record["env/all/reward/total"]
            seen["best_reward"] = max(seen["best_reward"], reward)
            print(
                f"[host] step {record['step']:4d}  reward {reward:.3f}  staleness {record['async/staleness_max']}",
                flush=True,
            )
            if reward >= args.threshold:
                seen["stopped_because"] = f"reward {reward:.3f} >= {args.threshold}"
                break
            if seen["steps"] >= args.stop_after:
                seen["stopped_because"] = f"{args.stop_after} steps"
                break
        # Stops the run (and the heartbeat): everything in this nursery is cancelled.
        nursery.cancel_scope.cancel()
    checkpoint = CheckpointLog(config.log_path).last()
    seen["checkpoint"] = (
        None if checkpoint is None else f"step {checkpoint.step} ({checkpoint.reason}) at {checkpoint.state_path}"
    )
    return seen


def main(argv: Sequence[str] | None = None, **overrides: Any) -> int:
    """Parse flags, run the host program, print what it saw."""
    args = parse_args(Args, argv, description=__doc__.splitlines()[0], **overrides)
    seen: dict[str, Any] = {}
    try:
        seen = trio.run(host, args)
    except* ConfigError as group:
        # Raised before the run or inside its nursery: the message, never a traceback.
        print("\n".join(f"error: {error}" for error in config_error_leaves(group)), file=sys.stderr)
    if not seen:
        return 2
    print(
        f"[host] stopped the run because {seen['stopped_because']}: {seen['steps']} steps seen, "
        f"best reward {seen['best_reward']:.3f}, {seen['heartbeats']} heartbeats; last checkpoint: {seen['checkpoint']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
