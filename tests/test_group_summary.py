"""A finished group waits for its step as a GroupSummary, whose metrics are those of its trajectories."""

from __future__ import annotations

import gc
from pathlib import Path

import trio

from trio_rl import AsyncConfig, Config, TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition, train
from trio_rl import _tinker_compat as compat
from trio_rl.rl.metrics import summary_metrics, trajectory_metrics
from trio_rl.rl.summary import GroupSummary
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec

# Summed in another order than trajectory order, these give another float.
ORDER_SENSITIVE = [1e16, 1.0, -1e16, 3.0]


def _transition(reward: float, value: float, ob_len: int = 2, ac_len: int = 1) -> Transition:
    ob = compat.model_input_from_ints(list(range(ob_len)))
    return Transition(ob, TokensWithLogprobs([7] * ac_len, [-0.5] * ac_len), reward, False, {"x": value})


def _groups() -> list[TrajectoryGroup]:
    final = compat.model_input_from_ints([])
    first = TrajectoryGroup(
        [
            Trajectory([_transition(0.5, ORDER_SENSITIVE[0], 3, 2), _transition(0.25, ORDER_SENSITIVE[1])], final),
            Trajectory([_transition(0.0, ORDER_SENSITIVE[2], 1, 4)], final),
        ],
        [0.1, 0.2],
        [{"g": 2.0}, {"g": 4.0}],
    )
    second = TrajectoryGroup([Trajectory([_transition(1.0, ORDER_SENSITIVE[3])], final)], [0.0], [{"g": 9.0}])
    return [first, second]


def test_summary_metrics_are_the_floats_of_the_trajectories_in_their_order() -> None:
    groups = _groups()
    metrics = summary_metrics([GroupSummary.of(g) for g in groups], [["a"], ["a", "b"]])
    # Transition values in trajectory order, as the cookbook gathers them.
    assert metrics["env/all/x"] == (((1e16 + 1.0) + -1e16) + 3.0) / 4
    assert metrics["env/all/x"] != sum(sorted(ORDER_SENSITIVE)) / 4
    assert metrics["env/all/g"] == 5.0
    assert metrics["env/all/reward/total"] == ((0.5 + 0.25 + 0.1) + (0.0 + 0.2) + 1.0) / 3
    assert metrics["env/all/total_episodes"] == 3
    assert metrics["env/all/total_turns"] == 4
    assert metrics["env/all/turns_per_episode"] == 4 / 3
    assert metrics["env/all/ac_tokens_per_turn"] == (2 + 1 + 4 + 1) / 4
    assert metrics["env/all/ob_tokens_per_turn"] == (3 + 2 + 1 + 2) / 4
    assert metrics["env/b/reward/total"] == 1.0
    assert metrics == trajectory_metrics(groups, [["a"], ["a", "b"]])


def test_a_summary_knows_constant_reward_groups() -> None:
    first, second = _groups()
    assert not GroupSummary.of(first).constant_reward
    assert GroupSummary.of(second).constant_reward


async def test_finished_groups_wait_for_their_step_without_their_trajectories(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # A long training step keeps the next batch's finished groups waiting for it.
    backend = FakeBackend(train_latency=1000.0, record_calls=False)
    dataset = FakeDataset(3, 50, FakeEnvSpec(group_size=4))
    config = Config(log_path=tmp_path, eval_every=0, save_every=0, max_tokens=8,
                    async_config=AsyncConfig(1, 50, "pace"))  # fmt: skip
    with trio.fail_after(10_000):
        async with backend, trio.open_nursery() as nursery:
            nursery.start_soon(lambda: train(config, dataset=dataset, backend=backend))
            await trio.sleep(500.0)
            gc.collect()
            alive = sum(isinstance(o, Trajectory) for o in gc.get_objects())
            nursery.cancel_scope.cancel()
    # 100 finished groups of 4 are waiting (the step in training and the next batch).
    assert alive == 0
