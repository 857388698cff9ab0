"""tinker-cookbook 0.6.1's async policy: the oldest completed groups first, nothing discarded, no waiting for stragglers."""

from __future__ import annotations

from .schedules import Admission, Minibatch, Need, Position, Schedule, Verdict
from .work import AbandonedGroup, Delivery, FinishedGroup, SkippedGroup


def _oldest_first(group: FinishedGroup) -> tuple[int, float, int, int]:
    # 0.6.1 sorts its completed groups by weights version with a stable sort,
    # so within a version they keep the order they finished in. Groups that
    # finish at the same instant are ordered by identity, never by which task
    # Trio happened to run first.
    return group.version, group.finished_at, group.item.order, group.item.attempt


class OldestFirst(Schedule):
    """Off-policy as tinker-cookbook 0.6.1's ``do_async_training``: train the oldest completed groups, discard nothing.

    - ``groups_per_step * (K + 1)`` rollout slots: an item is handed out, in
      dataset order, once a slot is free, and samples from the newest weights;
    - a trained group frees its slot once its step's weights are published (the
      trainer does that); a failed or filtered group frees it at once;
    - each step waits until it holds ``groups_per_step`` completed groups, also
      takes every group completed by that instant, and trains the
      ``groups_per_step`` sampled from the oldest weights (ties: the one that
      finished first); the rest carry over to later steps;
    - a slow rollout is trained when it finishes, however stale; no step waits
      for it and nothing is resampled or dropped;
    - steps do not map to dataset batches: at the end of data the groups left
      form a final, smaller step.

    Args:
        groups_per_step: B, the groups one step trains.
        num_substeps: optimizer steps per training step.
        staleness_limit: K; it sizes the slots and bounds nothing else.
        filter_constant: filter constant-reward groups the moment they arrive
            (``remove_constant_reward_groups``), as 0.6.1's rollout workers do.
    """

    def __init__(
        self, groups_per_step: int, num_substeps: int = 1, staleness_limit: int = 0, filter_constant: bool = False
    ) -> None:
        super().__init__(groups_per_step, num_substeps, staleness_limit, filter_constant=filter_constant)
        self._completed: list[FinishedGroup] = []
        self._planned: tuple[int, list[Minibatch]] = (-1, [])

    @property
    def samples_exact_version(self) -> bool:
        """Never: an item samples from the newest weights when it starts, as in 0.6.1."""
        return False

    def admit(self, position: Position, start_step: int) -> Admission:
        return Admission(
            min_version=start_step, step=None, step_size=None, consumed_before=self._async_bound(position.order)
        )

    def classify(self, delivery: Delivery, step: int) -> Verdict:
        assert not isinstance(delivery, AbandonedGroup), "OldestFirst never gives a rollout up"
        if isinstance(delivery, SkippedGroup):
            return Verdict.SKIP
        if self.filter_constant and delivery.summary.constant_reward:
            return Verdict.FILTER
        self._completed.append(delivery)
        return Verdict.KEEP

    def _filtered(self, groups: list[FinishedGroup]) -> tuple[FinishedGroup, ...]:
        # Filtered on arrival, so no step holds one to filter.
        return ()

    def need(self, step: int, ended: bool) -> Need:
        if self._planned[0] == step:
            return Need.NOTHING
        full = len(self._completed) >= self.groups_per_step
        return Need.THIS_INSTANT if full or ended else Need.ANOTHER_GROUP

    def next_minibatch(self, step: int) -> Minibatch | None:
        if self._planned[0] != step:
            self._completed.sort(key=_oldest_first)
            batch = self._completed[: self.groups_per_step]
            del self._completed[: self.groups_per_step]
            self._planned = self._substeps(step, batch)
        return self._planned[1].pop(0) if self._planned[1] else None
