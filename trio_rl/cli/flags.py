"""The examples' flags: a :class:`~trio_rl.Config` whose plain fields are flags, and the run's own flags.

Config's fields become flags as :mod:`trio_rl.cli.config_flags` says, so their names,
help and checks are written once, in Config. The flags declared here are the command
line's own: the shape of a run (``--mode``, ``--groups-per-batch``, ``--group-size``),
which build Config's structured fields; the backend; and what the run shows.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import tyro

from ..config import DEFAULT_LOSS_FN, AsyncConfig, Config, StreamMinibatchConfig
from ..errors import ConfigError
from ..rl.kl import KLReferenceConfig
from ..rl.rollouts import ErrorStrategy, FailFast, MinViableGroup, RetryOnFailure
from ..rl.termination import TerminationRewardPolicy
from ..sinks import SinkName
from .config_flags import CONFIG_FLAGS

A = TypeVar("A", bound="CommonArgs")

COMMAND_LINE_ASYNC_CONFIG = AsyncConfig(max_steps_off_policy=1, groups_per_batch=8)
"""The AsyncConfig of :class:`CommonArgs`: its fields are the async flags, ``groups_per_batch`` and ``loss_fn`` aside
(``--groups-per-batch`` sets the one, ``--loss-fn``, where given, the other: see :func:`make_config`)."""

COMMAND_LINE_CONFIG = Config(log_path="runs/example", max_steps=100, save_on_cancel=True)
"""The Config of :class:`CommonArgs`: Config's defaults, plus what a command line needs (a run folder, an
end, and Ctrl-C saving the last completed step)."""


@dataclass
class CommonArgs:
    """Flags every example understands; an example subclasses it to add its own and to set its defaults.

    ``config`` is the run's :class:`~trio_rl.Config`; an example gives its own as the
    field's default (``config: Config = CONFIG``), and every Config field but the
    structured ones (:data:`~trio_rl.cli.config_flags.NOT_FLAGS`) is a flag. The run's
    flags below build those: ``--mode`` with its flags the mode section,
    ``--error-strategy`` with its flags ``rollout_error_tolerance``,
    ``--kl-reference-model`` ``kl_reference_config``, and ``--zero-reward-on-limit``
    ``termination``.
    """

    config: Config = COMMAND_LINE_CONFIG
    """the run's configuration; the example's own Config gives the defaults"""
    mode: Literal["sync", "stream", "async"] = "async"
    """sync (on-policy), stream (on-policy, minibatches trained as they fill) or async (off-policy)"""
    async_flags: AsyncConfig = COMMAND_LINE_ASYNC_CONFIG
    """async only: the AsyncConfig whose fields are flags (--max-steps-off-policy, --staleness, --inflight-weights)"""
    num_minibatches: int = 2
    """stream only: minibatches per step (must divide --groups-per-batch)"""
    groups_per_batch: int = 8
    """groups (problems) per training step"""
    group_size: int = 8
    """samples per group; rewards are centred within a group"""
    error_strategy: Literal["model-default", "fail-fast", "retry", "min-viable"] = "model-default"
    """what a failed rollout does: the model's default as in tinker-cookbook 0.6.1 (min-viable for
    thinkingmachines/Inkling models, else fail-fast), fail the run, retry it, or keep a group with --min-successful
    rollouts"""
    max_retries: int = 3
    """retry and min-viable: retries for the whole group (one budget, as in tinker-cookbook)"""
    per_rollout_timeout: float | None = None
    """retry and min-viable: seconds one rollout attempt may take (None: no limit)"""
    min_successful: int | None = None
    """min-viable: the fewest successful rollouts that keep a group (None: ceil(0.75 * group size))"""
    kl_reference_model: str | None = None
    """with a KL penalty: the reference model (None: the --model being trained, as it started)"""
    zero_reward_on_limit: bool = False
    """clamp the reward of a trajectory that stopped on a limit to at most 0 (Config.termination, 0.6.1's policy)"""
    backend: Literal["local", "tinker"] = "local"
    """local (torch, in-process) or tinker (the Tinker service)"""
    base_url: str | None = None
    """tinker: service URL (None: TINKER_BASE_URL or the SDK's default)"""
    d_model: int = 64
    """local: transformer width"""
    n_layers: int = 2
    """local: transformer blocks"""
    n_heads: int = 4
    """local: attention heads"""
    max_seq_len: int = 64
    """local: longest sequence the model accepts"""
    progress: bool = True
    """show progress on stderr (a bar on a terminal, a line every --progress-every steps elsewhere)"""
    progress_every: int = 10
    """steps between progress lines when stderr is not a terminal"""
    log_to: tuple[SinkName, ...] = ()
    """also log every metrics.jsonl record to these (extras trio_rl[tensorboard], trio_rl[wandb])"""
    wandb_project: str = "trio_rl"
    """wandb: the project"""
    wandb_mode: Literal["offline", "online"] = "offline"
    """wandb: offline writes the run under --log-path/wandb (upload later with wandb sync); online uploads live"""
    debug: bool = False
    """on a failure, print the whole traceback (it is always written to error.log in --log-path)"""
    loss_fn_on_command_line: tyro.conf.Suppress[bool] = False
    """not a flag: whether --loss-fn was given (parse_args sets it), which an async run trains in place of the
    backend's default loss"""


def parse_args(cls: type[A], argv: Sequence[str] | None = None, *, description: str = "", **defaults: Any) -> A:
    """Parse ``argv`` into ``cls`` with tyro: each field is a ``--flag-name``, booleans also get ``--no-flag``.

    Every plain field of ``cls``'s :class:`~trio_rl.Config` is a flag too (see :mod:`trio_rl.cli.config_flags`).

    Args:
        cls: a dataclass deriving from :class:`CommonArgs`.
        argv: the arguments (``None``: ``sys.argv[1:]``).
        description: the ``--help`` header.
        **defaults: replace defaults, of ``cls``'s fields or of its Config's (flags in
            ``argv`` still win, ``--help`` shows them); tests use this to shrink a run.

    Returns:
        The parsed arguments as an instance of ``cls``.

    Raises:
        TypeError: for a default naming no field of ``cls`` or of :class:`~trio_rl.Config`, or a field
            of ``cls`` named like a Config field (its flag and default belong to the Config).
        SystemExit: code 2 for an invalid flag (after printing why), 0 after ``--help``.
    """
    config_names = {f.name for f in dataclasses.fields(Config)}
    redeclared = sorted(config_names & {f.name for f in dataclasses.fields(cls)})
    if redeclared:
        raise TypeError(
            f"{cls.__name__}.{redeclared[0]} is a Config field, so already a flag; "
            f"set its default in the Config that {cls.__name__}.config defaults to"
        )
    default = cls(**{name: value for name, value in defaults.items() if name not in config_names})
    config_defaults = {name: value for name, value in defaults.items() if name in config_names}
    default.config = dataclasses.replace(default.config, **config_defaults)
    with CONFIG_FLAGS:
        args = tyro.cli(cls, args=argv, description=description, default=default)
    # tyro returns values, not where they came from; whether the user chose the loss decides an async run's loss.
    args.loss_fn_on_command_line = _flag_given(sys.argv[1:] if argv is None else argv, "loss_fn")
    return args


def _flag_given(argv: Sequence[str], field: str) -> bool:
    """Whether ``argv`` sets the field's flag, in each spelling tyro accepts (dashes or underscores, ``=value``)."""
    for token in argv:
        if token == "--":
            return False
        if token.startswith("--") and token[2:].split("=", 1)[0].replace("-", "_") == field:
            return True
    return False


def make_config(args: CommonArgs, **overrides: Any) -> Config:
    """The run's :class:`Config`: ``args.config`` with the structured fields the run's flags build.

    Args:
        args: the parsed flags.
        **overrides: set any field directly.

    In async mode ``AsyncConfig.loss_fn`` is ``--loss-fn`` where the command line gave it, or
    the example's ``Config.loss_fn`` where that is not Config's default; otherwise it is left at
    ``None`` (or the example's own ``async_flags`` loss), so the run trains the backend's default.

    Raises:
        ConfigError: for a group size or batch below 1, an unknown mode, or invalid
            error-strategy flags (the rest is checked by :meth:`Config.validate`).
    """
    for name in ("group_size", "groups_per_batch"):
        if getattr(args, name) < 1:
            raise ConfigError(
                name, f"must be at least 1, got {getattr(args, name)} (a step of no groups trains nothing)"
            )
    config = args.config
    reference = args.kl_reference_model or config.base_model
    structured: dict[str, Any] = {
        "rollout_error_tolerance": _error_strategy(args),
        "kl_reference_config": KLReferenceConfig(reference) if config.kl_penalty_coef > 0 else None,
        "termination": TerminationRewardPolicy(zero_reward_on_limit=True) if args.zero_reward_on_limit else None,
        "async_config": None,
        "stream_minibatch_config": None,
    }
    # The --mode flag picks which of Config's mode sections is set; the run turns that section into its schedule.
    match args.mode:
        case "async":
            # One --loss-fn serves every mode. Left alone, an async run trains the backend's default
            # (AsyncConfig.loss_fn=None, as in code); a loss chosen on the command line, or by the
            # example (Config's default never conflicts, any other loss would), is trained as chosen.
            chosen = args.loss_fn_on_command_line or config.loss_fn != DEFAULT_LOSS_FN
            structured["async_config"] = dataclasses.replace(
                args.async_flags,
                groups_per_batch=args.groups_per_batch,
                loss_fn=config.loss_fn if chosen else args.async_flags.loss_fn,
            )
        case "stream":
            structured["stream_minibatch_config"] = StreamMinibatchConfig(args.groups_per_batch, args.num_minibatches)
        case "sync":
            pass
        case other:
            raise ConfigError("mode", f"unknown mode {other!r}; use sync, stream or async")
    return dataclasses.replace(config, **{**structured, **overrides})


def _error_strategy(args: CommonArgs) -> ErrorStrategy | None:
    if args.error_strategy == "model-default":
        return None  # Config.rollout_strategy() resolves it per base model
    try:
        if args.error_strategy == "retry":
            return RetryOnFailure(args.max_retries, args.per_rollout_timeout)
        if args.error_strategy == "min-viable":
            return MinViableGroup(args.min_successful, args.max_retries, args.per_rollout_timeout)
    except ValueError as error:
        raise ConfigError("rollout_error_tolerance", str(error)) from error
    return FailFast()
