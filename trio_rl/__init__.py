"""trio_rl: reinforcement-learning post-training of language models on Trio.

The public surface: the RL vocabulary (mirroring tinker-cookbook's ``rl/types.py``),
rollouts and error strategies, data processing, configuration, and the
:func:`train` / :func:`run` entry points. Backends live in :mod:`trio_rl.backends`,
fakes for tests in :mod:`trio_rl.testing`.
"""

from .backends.protocol import Backend, PendingResult, SamplingClient, Tokenizer, TrainingClient
from .checkpoint import CheckpointLog, CheckpointRecord
from .config import AsyncConfig, Config, StreamMinibatchConfig
from .kl import KLReferenceConfig
from .rl_test_set import RLTestSetEvaluator
from .data import assemble_training_data, compute_advantages, remove_constant_reward_groups, trajectory_to_data
from .determinism import derive_seed
from .errors import ConfigError, EvaluationTimeoutError, GroupFailedError
from .evaluation import SamplingClientEvaluator
from .metrics import trajectory_metrics
from .rollouts import (
    ErrorStrategy,
    FailFast,
    MinViableGroup,
    RetryOnFailure,
    SamplingPolicy,
    do_group_rollout,
    do_single_rollout,
)
from .schedule import Pace, Requeue, Schedule, Stream, Sync
from .train import RunHandle, TrainResult, run, train
from .types import (
    Action,
    Env,
    EnvGroupBuilder,
    Metrics,
    Observation,
    RLDataset,
    RolloutError,
    StepResult,
    StopCondition,
    TokensWithLogprobs,
    Trajectory,
    TrajectoryGroup,
    Transition,
)

__all__ = [
    "Action",
    "AsyncConfig",
    "Backend",
    "CheckpointLog",
    "CheckpointRecord",
    "Config",
    "ConfigError",
    "Env",
    "EnvGroupBuilder",
    "ErrorStrategy",
    "EvaluationTimeoutError",
    "FailFast",
    "GroupFailedError",
    "KLReferenceConfig",
    "Metrics",
    "MinViableGroup",
    "Observation",
    "Pace",
    "PendingResult",
    "RLDataset",
    "RLTestSetEvaluator",
    "Requeue",
    "RetryOnFailure",
    "RolloutError",
    "RunHandle",
    "SamplingClient",
    "SamplingClientEvaluator",
    "SamplingPolicy",
    "Schedule",
    "StepResult",
    "StopCondition",
    "Stream",
    "StreamMinibatchConfig",
    "Sync",
    "Tokenizer",
    "TokensWithLogprobs",
    "TrainResult",
    "TrainingClient",
    "Trajectory",
    "TrajectoryGroup",
    "Transition",
    "assemble_training_data",
    "compute_advantages",
    "derive_seed",
    "do_group_rollout",
    "do_single_rollout",
    "remove_constant_reward_groups",
    "run",
    "train",
    "trajectory_metrics",
    "trajectory_to_data",
]
