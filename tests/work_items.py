"""Hand-made work items and finished groups, for tests of the loop's objects without a run."""

from __future__ import annotations

from trio_rl.loop.work import FinishedGroup, ItemKey, WorkItem
from trio_rl.rl.data import TokenVersions
from trio_rl.rl.summary import GroupSummary
from trio_rl.testing import FakeEnvGroupBuilder, FakeEnvSpec


def work_item(order: int, *, step: int | None = None, step_size: int | None = None) -> WorkItem:
    """Group ``order`` of batch 0, on its first attempt, its builder a fake group's."""
    builder = FakeEnvGroupBuilder((0, order), FakeEnvSpec(), [])
    return WorkItem(ItemKey(0, order), order, builder, attempt=0, min_version=0, step=step, step_size=step_size)


def finished_group(
    item: WorkItem,
    version: int,
    *,
    rewards: tuple[float, ...] = (1.0, 0.0),
    trained_tokens: int = 0,
    token_versions: TokenVersions | None = None,
    finished_at: float = 0.0,
) -> FinishedGroup:
    """``item`` finished on weights ``version``: two one-turn trajectories, no data.

    Args:
        rewards: each trajectory's total reward (mixed by default, so it is not filtered).
        trained_tokens: action tokens that carry loss weight (the group has ``max(2, trained_tokens)``).
        token_versions: those tokens tallied by weights version (None: unknown).
        finished_at: when it finished.
    """
    ac_tokens = max(2, trained_tokens)
    summary = GroupSummary(
        rewards, 2, ac_tokens, 2, (), (), 0, (), trained_tokens=trained_tokens, token_versions=token_versions
    )
    return FinishedGroup(item, version, summary, [], [], finished_at=finished_at)
