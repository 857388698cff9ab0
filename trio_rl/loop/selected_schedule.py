"""The schedule a configuration selects: the one place where a run's mode becomes its schedule.

Built on the loop's side, so that the configuration imports no loop module.
"""

from __future__ import annotations

from ..config import Config
from .oldest_first import OldestFirst
from .schedules import Pace, Requeue, Schedule, Stream, Sync


def schedule_for(config: Config, dataset_batch_size: int) -> Schedule:
    """The schedule of the mode ``config`` selects (a fresh one: a schedule belongs to one run).

    Args:
        config: the run's configuration.
        dataset_batch_size: groups in the dataset's first batch; sync and stream
            steps follow each batch's own size, this only names the usual one.

    Returns:
        The mode's schedule.
    """
    if config.async_config is not None:
        ac = config.async_config
        if ac.staleness == "oldest_first":
            return OldestFirst(
                ac.groups_per_batch, config.num_substeps, ac.max_steps_off_policy, config.remove_constant_reward_groups
            )
        policy = Pace if ac.staleness == "pace" else Requeue
        return policy(ac.groups_per_batch, config.num_substeps, ac.max_steps_off_policy)
    if config.stream_minibatch_config is not None:
        sc = config.stream_minibatch_config
        return Stream(sc.groups_per_batch, sc.num_minibatches, config.num_substeps)
    return Sync(max(1, dataset_batch_size), config.num_substeps)
