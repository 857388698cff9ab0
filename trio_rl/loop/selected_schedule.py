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
    filter_constant = config.remove_constant_reward_groups
    if config.async_config is not None:
        ac = config.async_config
        policies: dict[str, type[OldestFirst] | type[Pace] | type[Requeue]] = {
            "oldest_first": OldestFirst,
            "pace": Pace,
            "requeue": Requeue,
        }
        policy = policies[ac.staleness]
        return policy(ac.groups_per_batch, config.num_substeps, ac.steps_ahead, filter_constant=filter_constant)
    if config.stream_minibatch_config is not None:
        sc = config.stream_minibatch_config
        return Stream(sc.groups_per_batch, sc.num_minibatches, config.num_substeps, filter_constant=filter_constant)
    return Sync(max(1, dataset_batch_size), config.num_substeps, filter_constant=filter_constant)
