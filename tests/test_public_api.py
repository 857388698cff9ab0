"""The public surface is what ``trio_rl/__init__.py`` exports, and every export is documented."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import trio_rl

EXPECTED = {
    # the RL vocabulary, as in tinker-cookbook's rl/types.py
    "Action", "Env", "EnvGroupBuilder", "Metrics", "Observation", "RLDataset", "RolloutError", "StepResult",
    "StopCondition", "TokensWithLogprobs", "Trajectory", "TrajectoryGroup", "Transition",
    "ActionExtra", "InitialObservationOverflow", "Logprobs", "Logs", "RLDatasetBuilder", "StopReason",
    "STOP_METRIC_PREFIX", "PARSE_ERROR_MASKED_METRIC_KEY",
    # running tinker-cookbook's asyncio code (trio_rl.asyncio_bridge)
    "BridgeMode", "DualSamplingClient", "runs_on",
    # rollouts and error strategies
    "ErrorStrategy", "FailFast", "MinViableGroup", "RetryOnFailure", "SamplingPolicy", "ParamsPerCall", "do_group_rollout",
    "do_single_rollout", "TerminationRewardPolicy", "EpochCycledDataset",
    # data processing and metrics
    "assemble_training_data", "compute_advantages", "remove_constant_reward_groups", "trajectory_to_data",
    "trajectory_metrics", "derive_seed",
    # configuration and schedules
    "AsyncConfig", "Config", "StreamMinibatchConfig", "KLReferenceConfig", "Schedule", "Sync", "Stream", "OldestFirst", "Pace", "Requeue",
    # errors
    "ConfigError", "EvaluationTimeoutError", "GroupFailedError",
    # the client protocol and evaluators
    "Backend", "PendingResult", "SamplingClient", "TrainingClient", "Tokenizer", "SamplingClientEvaluator",
    "RLTestSetEvaluator",
    # running and its results
    "RunHandle", "TrainResult", "run", "train", "tune_gc_for_training", "CheckpointLog", "CheckpointRecord",
}


def test_the_exported_names_are_exactly_the_public_surface() -> None:
    assert set(trio_rl.__all__) >= EXPECTED
    assert set(trio_rl.__all__) - EXPECTED == set(), "a new export: add it to EXPECTED on purpose"
    for name in trio_rl.__all__:
        assert hasattr(trio_rl, name), name


def test_every_export_has_a_docstring() -> None:
    undocumented = [
        name
        for name in trio_rl.__all__
        if (inspect.isclass(getattr(trio_rl, name)) or inspect.isfunction(getattr(trio_rl, name)))
        and not inspect.getdoc(getattr(trio_rl, name))
    ]
    assert undocumented == []


def test_examples_import_only_the_public_surface() -> None:
    allowed = {"trio_rl", "trio_rl.cli", "trio_rl.backends", "trio_rl.backends.hf", "trio_rl.testing"}
    for path in sorted(Path(__file__).parent.parent.joinpath("examples").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trio_rl"):
                assert node.module in allowed, f"{path.name} imports {node.module}"
