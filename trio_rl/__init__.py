"""trio_rl: reinforcement-learning post-training of language models on Trio.

The public surface: the RL vocabulary (tinker-cookbook 0.6.1's ``rl/types.py``, name
for name), the asyncio bridge for cookbook code (:mod:`trio_rl.asyncio_bridge`),
rollouts and error strategies, data processing, configuration, and the
:func:`train` / :func:`run` entry points. Backends live in :mod:`trio_rl.backends`,
fakes for tests in :mod:`trio_rl.testing`.
"""

from .asyncio_bridge import BridgeMode, DualSamplingClient, runs_on
from .backends.protocol import Backend, PendingResult, SamplingClient, Tokenizer, TrainingClient
from .base.determinism import derive_seed
from .config import AsyncConfig, Config, StreamMinibatchConfig
from .errors import ConfigError, EvaluationTimeoutError, GroupFailedError
from .loop.checkpoints import CheckpointLog, CheckpointRecord
from .loop.evaluation import SamplingClientEvaluator
from .loop.gc_policy import tune_gc_for_training
from .loop.oldest_first import OldestFirst
from .loop.schedules import Pace, Requeue, Schedule, Stream, Sync
from .loop.train import RunHandle, TrainResult, run, train
from .rl.data import assemble_training_data, compute_advantages, remove_constant_reward_groups, trajectory_to_data
from .rl.epochs import EpochCycledDataset
from .rl.kl import KLReferenceConfig
from .rl.metrics import trajectory_metrics
from .rl.rollouts import (
    ErrorStrategy,
    FailFast,
    MinViableGroup,
    ParamsPerCall,
    RetryOnFailure,
    SamplingPolicy,
    do_group_rollout,
    do_single_rollout,
)
from .rl.termination import TerminationRewardPolicy
from .rl.test_set import RLTestSetEvaluator
from .types import (
    PARSE_ERROR_MASKED_METRIC_KEY,
    STOP_METRIC_PREFIX,
    Action,
    ActionExtra,
    Env,
    EnvGroupBuilder,
    InitialObservationOverflow,
    Logprobs,
    Logs,
    Metrics,
    Observation,
    RLDataset,
    RLDatasetBuilder,
    RolloutError,
    StepResult,
    StopCondition,
    StopReason,
    TokensWithLogprobs,
    Trajectory,
    TrajectoryGroup,
    Transition,
)

__all__ = [
    "PARSE_ERROR_MASKED_METRIC_KEY",
    "STOP_METRIC_PREFIX",
    "Action",
    "ActionExtra",
    "AsyncConfig",
    "Backend",
    "BridgeMode",
    "CheckpointLog",
    "CheckpointRecord",
    "Config",
    "ConfigError",
    "DualSamplingClient",
    "Env",
    "EnvGroupBuilder",
    "EpochCycledDataset",
    "ErrorStrategy",
    "EvaluationTimeoutError",
    "FailFast",
    "GroupFailedError",
    "InitialObservationOverflow",
    "KLReferenceConfig",
    "Logprobs",
    "Logs",
    "Metrics",
    "MinViableGroup",
    "Observation",
    "OldestFirst",
    "Pace",
    "ParamsPerCall",
    "PendingResult",
    "RLDataset",
    "RLDatasetBuilder",
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
    "StopReason",
    "Stream",
    "StreamMinibatchConfig",
    "Sync",
    "TerminationRewardPolicy",
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
    "runs_on",
    "train",
    "trajectory_metrics",
    "trajectory_to_data",
    "tune_gc_for_training",
]
