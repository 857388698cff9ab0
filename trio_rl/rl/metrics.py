"""Trajectory metrics under tinker-cookbook's names, and the per-step metrics log."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import trio

from .. import _tinker_compat as compat
from ..sinks import JsonlSink
from ..types import Metrics, RolloutError, TrajectoryGroup
from .rollouts import is_initial_overflow

GOOD_REWARD_THRESHOLD = 0.5
"""A constant-reward group counts as all good at or above this reward, else all bad."""

WALL_TIME_PREFIX = "time/"
"""Metrics under this prefix measure wall time and differ between identical runs."""


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _ratio(total: int, count: int) -> float:
    return total / count if count else math.nan


class GroupSummary(NamedTuple):
    """What a step's records need to know of one rolled-out group, taken as soon as it is rolled out.

    A finished group waits for its step holding this instead of its trajectories:
    a few numbers and tuples, which the garbage collector stops tracking, where
    the trajectories are some eighty tracked objects (observations, actions,
    transitions). Counts are kept as totals; rewards and metric values keep the
    order the trajectories had, so the metrics made from summaries are the same
    floats as those made from the groups. (A named tuple, because it is quick
    to build; the collector stops tracking its tuples of numbers.)

    Attributes:
        total_rewards: per trajectory, its step rewards plus its final group reward.
        transitions: transitions over all trajectories (the group's turns).
        ac_tokens: action tokens over all transitions.
        ob_tokens: observation tokens over all transitions.
        transition_metrics: every transition's metrics, as ``(key, value)`` in order.
        group_metrics: the group's ``compute_group_rewards`` metrics, as ``(key, value)`` in order.
        initial_overflows: trajectories that ended at once on an overflowing prompt.
        rollout_errors: the group's failed rollout attempts.
    """

    total_rewards: tuple[float, ...]
    transitions: int
    ac_tokens: int
    ob_tokens: int
    transition_metrics: tuple[tuple[str, float], ...]
    group_metrics: tuple[tuple[str, float], ...]
    initial_overflows: int
    rollout_errors: tuple[RolloutError, ...]

    @classmethod
    def of(cls, group: TrajectoryGroup) -> GroupSummary:
        """The summary of ``group``."""
        transitions = ac_tokens = ob_tokens = overflows = 0
        values: list[tuple[str, float]] = []
        for trajectory in group.trajectories_G:
            overflows += is_initial_overflow(trajectory)
            for transition in trajectory.transitions:
                transitions += 1
                ac_tokens += len(transition.ac.tokens)
                ob_tokens += compat.token_count(transition.ob)
                values.extend((key, float(value)) for key, value in transition.metrics.items())
        return cls(
            total_rewards=tuple(group.get_total_rewards()),
            transitions=transitions,
            ac_tokens=ac_tokens,
            ob_tokens=ob_tokens,
            transition_metrics=tuple(values),
            group_metrics=tuple((k, float(v)) for metrics in group.metrics_G for k, v in metrics.items()),
            initial_overflows=overflows,
            rollout_errors=tuple(group.rollout_errors),
        )

    @property
    def constant_reward(self) -> bool:
        """Whether every trajectory got the same total reward (no learning signal), as :func:`is_constant_reward`."""
        rewards = self.total_rewards
        return all(r == rewards[0] for r in rewards)


def _metrics_for(prefix: str, groups: Sequence[GroupSummary]) -> Metrics:
    totals = [r for g in groups for r in g.total_rewards]
    # Integer totals add up the same in any order, so they are summed per group.
    turns = sum(g.transitions for g in groups)
    ac_tokens = sum(g.ac_tokens for g in groups)
    ob_tokens = sum(g.ob_tokens for g in groups)
    out: Metrics = {
        f"{prefix}/reward/total": _mean(totals),
        f"{prefix}/total_episodes": len(totals),
        f"{prefix}/total_turns": turns,
        f"{prefix}/turns_per_episode": _ratio(turns, len(totals)),
        f"{prefix}/total_ac_tokens": ac_tokens,
        f"{prefix}/total_ob_tokens": ob_tokens,
        f"{prefix}/ac_tokens_per_turn": _ratio(ac_tokens, turns),
        f"{prefix}/ob_tokens_per_turn": _ratio(ob_tokens, turns),
    }
    mixed = good = bad = 0
    for group in groups:
        rewards = group.total_rewards
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
    # Every transition's values first, then every group's, as the cookbook gathers them.
    per_key: dict[str, list[float]] = defaultdict(list)
    for group in groups:
        for key, value in group.transition_metrics:
            per_key[key].append(value)
    for group in groups:
        for key, value in group.group_metrics:
            per_key[key].append(value)
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
    return summary_metrics([GroupSummary.of(g) for g in groups], tags)


def summary_metrics(groups: Sequence[GroupSummary], tags: Sequence[Sequence[str]]) -> Metrics:
    """:func:`trajectory_metrics` of the groups these summaries were taken of."""
    if len(groups) != len(tags):
        raise ValueError(f"{len(groups)} groups but {len(tags)} tag lists")
    out = _metrics_for("env/all", groups)
    by_tag: dict[str, list[GroupSummary]] = defaultdict(list)
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
