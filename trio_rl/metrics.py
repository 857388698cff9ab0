"""Trajectory metrics under tinker-cookbook's names, and the per-step metrics log."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from . import _tinker_compat as compat
from .sinks import JsonlSink
from .types import Metrics, TrajectoryGroup

GOOD_REWARD_THRESHOLD = 0.5
"""A constant-reward group counts as all good at or above this reward, else all bad."""

WALL_TIME_PREFIX = "time/"
"""Metrics under this prefix measure wall time and differ between identical runs."""


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _metrics_for(prefix: str, groups: Sequence[TrajectoryGroup]) -> Metrics:
    trajectories = [t for g in groups for t in g.trajectories_G]
    totals = [r for g in groups for r in g.get_total_rewards()]
    turns = [len(t.transitions) for t in trajectories]
    ac_tokens = [len(tr.ac.tokens) for t in trajectories for tr in t.transitions]
    ob_tokens = [compat.token_count(tr.ob) for t in trajectories for tr in t.transitions]
    out: Metrics = {
        f"{prefix}/reward/total": _mean(totals),
        f"{prefix}/total_episodes": len(trajectories),
        f"{prefix}/total_turns": sum(turns),
        f"{prefix}/turns_per_episode": _mean(turns),
        f"{prefix}/total_ac_tokens": sum(ac_tokens),
        f"{prefix}/total_ob_tokens": sum(ob_tokens),
        f"{prefix}/ac_tokens_per_turn": _mean(ac_tokens),
        f"{prefix}/ob_tokens_per_turn": _mean(ob_tokens),
    }
    mixed = good = bad = 0
    for group in groups:
        rewards = group.get_total_rewards()
        if not rewards:
            continue
        if any(r != rewards[0] for r in rewards):
            mixed += 1
        elif rewards[0] >= GOOD_REWARD_THRESHOLD:
            good += 1
        else:
            bad += 1
    counted = mixed + good + bad
    if counted:
        out[f"{prefix}/by_group/frac_mixed"] = mixed / counted
        out[f"{prefix}/by_group/frac_all_good"] = good / counted
        out[f"{prefix}/by_group/frac_all_bad"] = bad / counted
    per_key: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        for tr in t.transitions:
            for key, value in tr.metrics.items():
                per_key[key].append(float(value))
    for group in groups:
        for metrics in group.metrics_G:
            for key, value in metrics.items():
                per_key[key].append(float(value))
    for key, values in sorted(per_key.items()):
        out[f"{prefix}/{key}"] = _mean(values)
    return out


def trajectory_metrics(groups: Sequence[TrajectoryGroup], tags: Sequence[Sequence[str]]) -> Metrics:
    """Reward, episode, turn and token metrics for a batch, overall and per logging tag.

    Args:
        groups: the batch's groups.
        tags: each group's ``logging_tags()``, aligned with ``groups``.

    Returns:
        ``env/all/...`` for every group and ``env/<tag>/...`` for each tag's groups,
        the latter only when some tag selects a strict subset of the groups (as
        the cookbook does: a tag that covers every group would repeat ``env/all``).
    """
    if len(groups) != len(tags):
        raise ValueError(f"{len(groups)} groups but {len(tags)} tag lists")
    out = _metrics_for("env/all", groups)
    by_tag: dict[str, list[TrajectoryGroup]] = defaultdict(list)
    for group, group_tags in zip(groups, tags, strict=True):
        for tag in group_tags:
            by_tag[tag].append(group)
    if any(len(tagged) < len(groups) for tagged in by_tag.values()):
        for tag in sorted(by_tag):
            out.update(_metrics_for(f"env/{tag}", by_tag[tag]))
    return out


class MetricsLog:
    """Writes each record to ``metrics.jsonl`` the moment it is made, and mirrors it on a live channel.

    A training step's record is written when the step ends; an evaluation's
    record is written when the evaluation ends, as a line of its own under the
    step whose weights it evaluated. So a slow evaluation never holds back the
    training records, and every line says which weights it describes.

    Nothing is kept in memory: a long run's records live in the file. The live
    channel exists only for a run that has a reader (``nursery.start``), and holds
    at most ``live_buffer`` records a slow reader has not taken yet; records past
    that are not mirrored (they are still in the file) and are counted in
    :attr:`live_dropped`.

    Args:
        path: the ``metrics.jsonl`` to append to.
        live_buffer: records the live channel may hold; 0 for no live channel.
    """

    def __init__(self, path: Path | None, *, live_buffer: int = 0) -> None:
        self._jsonl = JsonlSink(path) if path is not None else None
        self._live_send, self.live = trio.open_memory_channel[dict[str, Any]](live_buffer)
        self._mirror = live_buffer > 0
        self.live_dropped = 0
        """Records not mirrored on the live channel because its reader fell behind."""
        self.last_final: dict[str, Any] | None = None
        """The newest end-of-run record written (the one with ``run/final_step``)."""

    def write(self, step: int, metrics: Metrics) -> None:
        """Write a record of ``metrics`` under ``step``."""
        record: dict[str, Any] = {"step": step, **metrics}
        if "run/final_step" in record:
            self.last_final = record
        if self._jsonl is not None:
            self._jsonl.write(record)
        if self._mirror:
            try:
                self._live_send.send_nowait(record)
            except (trio.WouldBlock, trio.BrokenResourceError):
                self.live_dropped += 1

    def close(self) -> None:
        """Close the file and end the live channel."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        self._live_send.close()


def merge_by_step(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One dict per step, merging a step's training, evaluation and end-of-run records, in step order."""
    merged: dict[int, dict[str, Any]] = {}
    for record in records:
        merged.setdefault(record["step"], {}).update(record)
    return [merged[step] for step in sorted(merged)]
