"""Trajectory metrics under tinker-cookbook's names, computed from group summaries (:class:`~trio_rl.rl.summary.GroupSummary`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from ..types import Metrics, TrajectoryGroup
from .summary import GroupSummary

GOOD_REWARD_THRESHOLD = 0.5
"""A constant-reward group counts as all good at or above this reward, else all bad."""

WALL_TIME_PREFIX = "time/"
"""Metrics under this prefix measure wall time and differ between identical runs."""


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _ratio(total: int, count: int) -> float:
    return total / count if count else math.nan


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
