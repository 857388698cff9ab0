"""Progress of a run on stderr, through tqdm: a live bar on a terminal, a plain line every N steps elsewhere."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from tqdm import tqdm

REWARD_KEY = "env/all/reward/total"
"""The mean total reward of a step's trajectories."""

STEP_KEY = "progress/groups"
"""Present in the record of a training step (and not in the final-weights record)."""


class RunProgress:
    """Shows each training step's record: step, reward, latest evaluation, staleness, throughput, time.

    On a terminal a tqdm bar is redrawn in place (elapsed and remaining time, steps
    per second, the rest as its postfix). Elsewhere (a log file, CI) the same
    text is written as one plain line every ``every`` steps and at the last step.
    """

    def __init__(self, out: IO[str], total_steps: int | None, eval_keys: Sequence[str] = (), every: int = 10) -> None:
        self.out = out
        self.total_steps = total_steps
        self.eval_keys = list(eval_keys)
        self.every = max(1, every)
        self.tokens = 0
        self.steps: int | None = None
        """Steps done so far; None before the first record (a resumed run starts past 0)."""
        self.last_eval: dict[str, float] = {}
        self.started = time.monotonic()
        self._initial = 0
        self._bar: tqdm[Any] | None = None

    def postfix(self, record: Mapping[str, Any], elapsed: float) -> str:
        """Reward, the latest evaluation, staleness and throughput of ``record``."""
        reward = record.get(REWARD_KEY)
        parts = [f"reward {reward:.3f}" if isinstance(reward, float) else "reward -"]
        parts += [f"{key.rsplit('/', 1)[-1]} {value:.3f}" for key, value in self.last_eval.items()]
        parts += [
            f"stale<={record.get('async/staleness_max', 0)}",
            f"{record.get('progress/trained_groups', 0) / elapsed:.1f} groups/s",
            f"{self.tokens / elapsed / 1000:.1f}k tok/s",
        ]
        return ", ".join(parts)

    def update(self, record: Mapping[str, Any]) -> None:
        """Show one metrics record (a training step; evaluations are remembered until the next)."""
        for key in self.eval_keys:
            value = record.get(key)
            if isinstance(value, (int, float)):
                self.last_eval[key] = float(value)
        if STEP_KEY not in record:
            return
        self.tokens += int(record.get("env/all/total_ac_tokens", 0)) + int(record.get("env/all/total_ob_tokens", 0))
        done = int(record["step"]) + 1
        if self.steps is None:
            # Steps trained before a resume count as done, not as this run's speed.
            self.steps = self._initial = done - 1
            if self.out.isatty():
                self._bar = tqdm(
                    total=self.total_steps, initial=self._initial, file=self.out, unit="step", dynamic_ncols=True
                )
        advanced, self.steps = done - self.steps, done
        elapsed = max(1e-9, time.monotonic() - self.started)
        postfix = self.postfix(record, elapsed)
        if self._bar is not None:
            self._bar.set_postfix_str(postfix, refresh=False)
            self._bar.update(advanced)
        elif done % self.every == 0 or done == self.total_steps:
            # tqdm takes None for an unknown total; its stub says float.
            total: Any = self.total_steps
            meter = tqdm.format_meter(
                done, total, elapsed, ncols=0, unit="step", postfix=postfix, initial=self._initial
            )
            self.out.write(meter.strip() + "\n")
            self.out.flush()

    def close(self) -> None:
        """End the bar (a terminal keeps its last state)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
