"""Command-line plumbing shared by the examples: flags (tyro), backend, progress, sinks, Ctrl-C.

An example declares its flags as a dataclass deriving from :class:`CommonArgs`
(each field is a ``--flag``; its docstring is the help text) and ends with::

    def build(args: Args, tokenizer: LazyTokenizer) -> Experiment:
        ...build the dataset and evaluators from the tokenizer...
        return Experiment(dataset, evaluators, curve_keys=("eval/accuracy",))

    def main(argv=None, **defaults) -> int:
        return run_example(Args, build, argv, alphabet=ALPHABET, description=..., **defaults)

:func:`run_example` parses the flags, builds the :class:`~trio_rl.Config` and checks it,
and runs :func:`trio_rl.train` under ``trio.run`` (:func:`run_cli`) with a progress bar
on stderr and the ``--log-to`` sinks, both fed live from :attr:`RunHandle.metrics`.
It writes ``reward_curve.png`` into the run folder at the end and on Ctrl-C. Ctrl-C is
a clean stop: the run's scope is cancelled, the trainer saves the last completed step
(``Config.save_on_cancel``), one line says where that checkpoint is, and the exit code
is 130. An invalid configuration prints its :class:`ConfigError` and exits with 2,
whether it is found while parsing, before the run, or inside it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal, Self, TypeVar

import trio
import tyro

from ..backends.protocol import Backend, SamplingClient, Tokenizer, TrainingClient
from ..config import AsyncConfig, Config, StreamMinibatchConfig
from ..errors import ConfigError
from ..loop.checkpoints import CheckpointLog
from ..loop.evaluation import SamplingClientEvaluator
from ..loop.gc_policy import tune_gc_for_training
from ..loop.train import RunHandle, TrainResult, train
from ..rl.kl import KLReferenceConfig
from ..rl.rollouts import ErrorStrategy, FailFast, MinViableGroup, RetryOnFailure
from ..sinks import MetricsSink, SinkName, close_sinks, open_sinks
from ..types import RLDataset
from .plotting import write_curves
from .progress import REWARD_KEY, RunProgress

EXIT_OK = 0
EXIT_CONFIG_ERROR = 2
"""What argparse (and so tyro) exits with for a bad flag; an invalid configuration uses it too."""
EXIT_INTERRUPTED = 130
"""128 + SIGINT, what shells report for a program stopped by Ctrl-C."""
EXIT_TERMINATED = 143
"""128 + SIGTERM: a run stopped by ``kill`` (or a job scheduler) ends like one stopped by Ctrl-C."""
EXIT_ERROR = 1
"""The run failed: one line per error, the full traceback in ``error.log`` in the run folder."""
ERROR_LOG = "error.log"
DEBUG_ENV = "TRIO_RL_DEBUG"
"""Set to 1 to print the whole traceback of a failed run (like ``--debug``)."""

LossFn = Literal["importance_sampling", "ppo", "cispo", "dro", "cross_entropy"]
"""The losses :data:`trio_rl.config.LOSS_FNS` accepts, as choices of ``--loss-fn``."""

A = TypeVar("A", bound="CommonArgs")


@dataclass
class CommonArgs:
    """Flags every example understands; examples subclass it to change defaults and add their own.

    Every :class:`~trio_rl.Config` field has a flag here (``--model`` is ``base_model``;
    ``--mode`` with the mode's own flags selects ``async_config`` or
    ``stream_minibatch_config``; ``--error-strategy`` with its flags is ``rollout_error_tolerance``;
    ``--kl-reference-model`` is ``kl_reference_config``).
    """

    log_path: str = "runs/example"
    """run folder: metrics.jsonl, config.json, checkpoints, reward_curve.png"""
    mode: Literal["sync", "stream", "async"] = "async"
    """sync (on-policy), stream (on-policy, minibatches trained as they fill) or async (off-policy)"""
    staleness: Literal["requeue", "pace"] = "pace"
    """async only: pace sampling so no group gets more than K steps stale (tinker-cookbook 0.6.1), or requeue staler ones (0.5.5)"""
    max_steps_off_policy: int = 1
    """async only: K, how many steps stale a trained group may be"""
    num_minibatches: int = 2
    """stream only: minibatches per step (must divide --groups-per-batch)"""
    groups_per_batch: int = 8
    """groups (problems) per training step"""
    group_size: int = 8
    """samples per group; rewards are centred within a group"""
    learning_rate: float = 1e-3
    """Adam learning rate"""
    adam_beta1: float = 0.9
    """Adam's first-moment decay"""
    adam_beta2: float = 0.95
    """Adam's second-moment decay"""
    adam_eps: float = 1e-8
    """Adam's epsilon"""
    weight_decay: float = 0.0
    """Adam's decoupled weight decay"""
    grad_clip_norm: float = 0.0
    """clip the gradient to this global norm (0: no clipping)"""
    loss_fn: LossFn = "importance_sampling"
    """the loss sent with forward_backward"""
    loss_fn_config: dict[str, float] | None = None
    """loss parameters as NAME VALUE pairs, e.g. clip_low_threshold 0.8 (None: the loss's defaults)"""
    num_substeps: int = 1
    """optimizer steps per training step (the batch is split evenly)"""
    temperature: float = 1.0
    """sampling temperature of rollouts"""
    top_k: int = -1
    """sample from the k most likely tokens only (-1: all)"""
    top_p: float = 1.0
    """nucleus sampling: the smallest set of tokens with this much probability (1: all)"""
    max_tokens: int = 16
    """most tokens per sampled action"""
    max_steps: int = 100
    """training steps"""
    eval_every: int = 10
    """evaluate every N steps (0: only the final weights)"""
    save_every: int = 50
    """save a resumable checkpoint every N steps (0: only the final state)"""
    eval_timeout: float = 1800.0
    """seconds one evaluator may take on one set of weights; a slower one ends the run"""
    remove_constant_reward_groups: bool = False
    """drop groups whose rewards are all equal (they carry no advantage)"""
    kl_penalty_coef: float = 0.0
    """KL penalty against the reference model, added to the advantages as tinker-cookbook does (0: none)"""
    kl_discount_factor: float = 0.0
    """with a KL penalty: sum each token's penalty over the future with this discount (0: none)"""
    kl_reference_model: str | None = None
    """with a KL penalty: the reference model (None: the --model being trained, as it started)"""
    seed: int = 0
    """seed of the data, the initial weights and every rollout"""
    num_workers: int | None = None
    """concurrent rollout workers (None: enough for every group in flight)"""
    error_strategy: Literal["fail-fast", "retry", "min-viable"] = "fail-fast"
    """what a failed rollout does: fail the run, retry it, or keep a group with --min-successful rollouts"""
    max_retries: int = 3
    """retry and min-viable: retries for the whole group (one budget, as in tinker-cookbook)"""
    per_rollout_timeout: float | None = None
    """retry and min-viable: seconds one rollout attempt may take (None: no limit)"""
    min_successful: int | None = None
    """min-viable: the fewest successful rollouts that keep a group (None: ceil(0.75 * group size))"""
    resume: bool = False
    """continue from the newest checkpoint in --log-path that loads"""
    overwrite: bool = False
    """replace the run already in --log-path (without this or --resume, such a folder is refused)"""
    load_checkpoint_path: str | None = None
    """start from the weights of this saved state (without its optimizer state)"""
    save_on_cancel: bool = True
    """on Ctrl-C, save the state of the last completed step"""
    cancel_save_timeout: float = 60.0
    """seconds the save on Ctrl-C may take"""
    backend: Literal["local", "tinker"] = "local"
    """local (torch, in-process) or tinker (the Tinker service)"""
    model: str | None = None
    """tinker: the base model to fine-tune (LoRA); local: a label only"""
    base_url: str | None = None
    """tinker: service URL (None: TINKER_BASE_URL or the SDK's default)"""
    lora_rank: int = 32
    """tinker: LoRA rank"""
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
    asyncio_bridge: Literal["auto", "always", "never"] = "auto"
    """run env and evaluator coroutines that need asyncio on a loop inside the run: decide per call, always, or never"""
    debug: bool = False
    """on a failure, print the whole traceback (it is always written to error.log in --log-path)"""


# ---------------------------------------------------------------- flags and configuration


def parse_args(cls: type[A], argv: Sequence[str] | None = None, *, description: str = "", **defaults: Any) -> A:
    """Parse ``argv`` into ``cls`` with tyro: each field is a ``--flag-name``, booleans also get ``--no-flag``.

    Args:
        cls: a dataclass deriving from :class:`CommonArgs`.
        argv: the arguments (``None``: ``sys.argv[1:]``).
        description: the ``--help`` header.
        **defaults: replace field defaults (flags in ``argv`` still win, ``--help`` shows
            them); tests use this to shrink a run.

    Returns:
        The parsed arguments as an instance of ``cls``.

    Raises:
        TypeError: for a default naming no field of ``cls``.
        SystemExit: code 2 for an invalid flag (after printing why), 0 after ``--help``.
    """
    return tyro.cli(cls, args=argv, description=description, default=cls(**defaults))


def _error_strategy(args: CommonArgs) -> ErrorStrategy:
    try:
        if args.error_strategy == "retry":
            return RetryOnFailure(args.max_retries, args.per_rollout_timeout)
        if args.error_strategy == "min-viable":
            return MinViableGroup(args.min_successful, args.max_retries, args.per_rollout_timeout)
    except ValueError as error:
        raise ConfigError("rollout_error_tolerance", str(error)) from error
    return FailFast()


def make_config(args: CommonArgs, **overrides: Any) -> Config:
    """The run's :class:`Config` from the flags; ``overrides`` set any field directly.

    Flags named like a ``Config`` field are copied; ``--model``, ``--mode`` and
    ``--error-strategy`` are translated.

    Raises:
        ConfigError: for an unknown mode or invalid error-strategy flags (the rest
            is checked by :meth:`Config.validate`).
    """
    for name in ("group_size", "groups_per_batch"):
        if getattr(args, name) < 1:
            raise ConfigError(
                name, f"must be at least 1, got {getattr(args, name)} (a step of no groups trains nothing)"
            )
    names = {f.name for f in dataclasses.fields(Config)}
    values: dict[str, Any] = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.name in names}
    values["base_model"] = args.model or "trio-rl-tiny"
    values["rollout_error_tolerance"] = _error_strategy(args)
    if args.kl_penalty_coef > 0:
        values["kl_reference_config"] = KLReferenceConfig(args.kl_reference_model or values["base_model"])
    # The --mode flag picks which of Config's mode sections is set; Config builds the schedule.
    match args.mode:
        case "async":
            values["async_config"] = AsyncConfig(args.max_steps_off_policy, args.groups_per_batch, args.staleness)
        case "stream":
            values["stream_minibatch_config"] = StreamMinibatchConfig(args.groups_per_batch, args.num_minibatches)
        case "sync":
            pass
        case other:
            raise ConfigError("mode", f"unknown mode {other!r}; use sync, stream or async")
    values.update(overrides)
    return Config(**values)


# ---------------------------------------------------------------- backends


class LazyTokenizer:
    """A tokenizer known only once the backend has created a training client.

    With Tinker the tokenizer comes from the training client, which :func:`train`
    creates; envs hold this stand-in and use it once rollouts start.
    """

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self._tokenizer = tokenizer

    def bind(self, tokenizer: Tokenizer) -> None:
        """Make ``tokenizer`` the real one."""
        self._tokenizer = tokenizer

    def get(self) -> Tokenizer:
        """The real tokenizer.

        Raises:
            RuntimeError: before a training client exists.
        """
        if self._tokenizer is None:
            raise RuntimeError("the tokenizer is known only once the training client exists")
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        return self.get().encode(text)

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens``."""
        return self.get().decode(tokens)


class _BindTokenizer:
    """Wraps a backend so that each training client it creates binds its tokenizer."""

    def __init__(self, inner: Backend, tokenizer: LazyTokenizer) -> None:
        self._inner = inner
        self._tokenizer = tokenizer

    async def __aenter__(self) -> Self:
        await self._inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._inner.__aexit__(exc_type, exc, tb)

    async def _bound(self, client: TrainingClient) -> TrainingClient:
        self._tokenizer.bind(await client.get_tokenizer())
        return client

    async def create_training_client(
        self, *, base_model: str, lora_rank: int = 32, seed: int | None = None
    ) -> TrainingClient:
        return await self._bound(
            await self._inner.create_training_client(base_model=base_model, lora_rank=lora_rank, seed=seed)
        )

    async def create_training_client_from_state(self, path: str, *, with_optimizer: bool = True) -> TrainingClient:
        return await self._bound(
            await self._inner.create_training_client_from_state(path, with_optimizer=with_optimizer)
        )

    async def create_sampling_client(self, *, base_model: str, model_path: str | None = None) -> SamplingClient:
        return await self._inner.create_sampling_client(base_model=base_model, model_path=model_path)

    def check_loss_fn(self, loss_fn: str, loss_fn_config: dict[str, float] | None) -> None:
        check: Callable[[str, dict[str, float] | None], None] | None = getattr(self._inner, "check_loss_fn", None)
        if check is not None:
            check(loss_fn, loss_fn_config)


def make_backend(args: CommonArgs, *, alphabet: str) -> tuple[Backend, LazyTokenizer]:
    """The backend named by ``--backend`` and the tokenizer envs should use.

    Args:
        args: the parsed flags.
        alphabet: for ``local``, the characters of the :class:`CharTokenizer`.

    Returns:
        The (not yet entered) backend and a :class:`LazyTokenizer`: bound at once
        for ``local``, once the training client exists for ``tinker``.

    Raises:
        ConfigError: for an unknown backend, ``tinker`` without ``--model``, or
            ``local`` without the ``local`` extra (torch).
    """
    if args.backend == "local":
        try:
            from ..backends.local import CharTokenizer, LocalBackend, ModelConfig
        except ImportError as error:
            raise ConfigError("backend", f"local needs torch: pip install 'trio_rl[local]' ({error})") from error

        tokenizer = CharTokenizer(alphabet)
        sizes = ModelConfig(
            d_model=args.d_model,
            n_layers=args.n_layers,
            n_heads=args.n_heads,
            d_ff=4 * args.d_model,
            max_seq_len=args.max_seq_len,
        )
        backend = LocalBackend(log_dir=args.log_path, model_config=sizes, tokenizer=tokenizer, seed=args.seed)
        return backend, LazyTokenizer(tokenizer)
    if args.backend == "tinker":
        if not args.model:
            raise ConfigError("model", "--backend tinker needs --model <base model name>, e.g. meta-llama/Llama-3.2-1B")
        from ..backends.tinker import TinkerBackend

        lazy = LazyTokenizer()
        return _BindTokenizer(TinkerBackend(base_url=args.base_url), lazy), lazy
    raise ConfigError("backend", f"unknown backend {args.backend!r}; use local or tinker")


# ---------------------------------------------------------------- running


@dataclass
class _Outcome:
    result: TrainResult | None = None
    stopped_by: int | None = None
    """The first SIGINT or SIGTERM that stopped the run."""
    presses: int = 0

    @property
    def interrupted(self) -> bool:
        return self.stopped_by is not None

    @property
    def exit_code(self) -> int:
        return EXIT_TERMINATED if self.stopped_by == signal.SIGTERM else EXIT_INTERRUPTED


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_EARLY_SIGNALS: list[int] = []
"""SIGTERMs that arrived after trio.run began but before the watcher listened (see _hand_signals_to_trio)."""


async def _chain(first: list[int], then: AsyncIterator[int]) -> AsyncIterator[int]:
    while first:
        yield first.pop(0)
    async for signum in then:
        yield signum


async def _watch_for_stop_signals(
    run_scope: trio.CancelScope,
    outcome: _Outcome,
    out: IO[str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Ctrl-C (or SIGTERM) cancels the run, which saves its last completed step; the third quits unsaved.

    The receiver stays open for the whole run, so no press can ever land as a
    ``KeyboardInterrupt`` inside the shielded save.
    """
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        task_status.started()
        async for signum in _chain(_EARLY_SIGNALS, signals):
            outcome.presses += 1
            if outcome.stopped_by is None:
                outcome.stopped_by = signum
                out.write(
                    "\ninterrupted: saving the last completed step (press Ctrl-C twice more to quit without saving)\n"
                )
                run_scope.cancel()
            elif outcome.presses == 2:
                out.write("still saving the last completed step; Ctrl-C once more quits without saving\n")
            else:
                # Everything on disk is whole: a state being saved is not yet in
                # checkpoints.jsonl, so a resume takes the checkpoint before it.
                out.write("quitting without saving; --resume continues from the last recorded checkpoint\n")
                out.flush()
                os._exit(outcome.exit_code)
            out.flush()


@dataclass
class _Watchers:
    """Everything that reads the live records: the progress bar and the sinks."""

    progress: RunProgress | None
    sinks: Sequence[MetricsSink]

    def show(self, record: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress.update(record)
        for sink in self.sinks:
            sink.write(record)


async def _run(
    config: Config,
    dataset: RLDataset,
    backend: Backend,
    evaluators: Sequence[SamplingClientEvaluator],
    watchers: _Watchers,
    outcome: _Outcome,
    out: IO[str],
) -> None:
    run_scope = trio.CancelScope()

    async def train_into_outcome(*, task_status: trio.TaskStatus[RunHandle] = trio.TASK_STATUS_IGNORED) -> None:
        outcome.result = await train(
            config, dataset=dataset, backend=backend, evaluators=evaluators, task_status=task_status
        )

    handle: RunHandle | None = None
    async with trio.open_nursery() as outer:
        await outer.start(_watch_for_stop_signals, run_scope, outcome, out)
        # The backend is entered outside the run's scope: a cancelled run still
        # needs the backend's workers to save its last step.
        async with backend:
            with run_scope:
                async with trio.open_nursery() as run_nursery:
                    started: RunHandle = await run_nursery.start(train_into_outcome)
                    handle = started
                    async for record in started.metrics:
                        watchers.show(record)
        outer.cancel_scope.cancel()
    # A cancelled run still releases its last records when it ends: the sinks get
    # them too, so they hold what metrics.jsonl holds.
    while handle is not None:
        try:
            watchers.show(handle.metrics.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break


def config_error_leaves(group: BaseExceptionGroup[ConfigError]) -> list[ConfigError]:
    """The leaves of a (possibly nested) group: a nursery wraps the error of a nested nursery again."""
    return _distinct_leaves(group)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


def _summary(result: TrainResult, elapsed: str, curve_keys: Sequence[str]) -> list[str]:
    summary = [f"done: {result.final_step} steps in {elapsed}"]
    records = result.metrics
    steps = [r for r in records if "progress/groups" in r]
    if steps and isinstance(steps[-1].get(REWARD_KEY), float):
        summary.append(f"last reward {steps[-1][REWARD_KEY]:.3f}")
    # The final weights' record merges the end-of-run accounting and their evaluation.
    final = records[-1] if records else {}
    for key in curve_keys:
        value = final.get(key)
        if isinstance(value, (int, float)):
            summary.append(f"final {key} {value:.3f}")
    return summary


def run_cli(
    config: Config,
    *,
    dataset: RLDataset,
    backend: Backend,
    evaluators: Sequence[SamplingClientEvaluator] = (),
    curve_keys: Sequence[str] = (),
    progress: bool = True,
    progress_every: int = 10,
    sinks: Sequence[MetricsSink] = (),
    out: IO[str] | None = None,
    debug: bool = False,
) -> int:
    """Train under ``trio.run`` with progress, sinks and a clean Ctrl-C; return the exit code.

    Args:
        config: the run's configuration.
        dataset, backend, evaluators: as for :func:`trio_rl.train`; ``backend`` not yet entered.
        curve_keys: evaluation metrics shown in the progress and plotted beside the reward.
        progress: show progress on ``out``; ``progress_every``: steps per line off a terminal.
        sinks: receive every record of ``metrics.jsonl``, in the same order; closed at the end.
        out: where progress and messages go (default: stderr).
        debug: print the whole traceback of a failure (also with ``TRIO_RL_DEBUG=1``).

    Returns:
        0 when the run finished, 130 when Ctrl-C stopped it (143 for SIGTERM), 2 for an
        invalid configuration, 1 when the run failed.
    """
    stream: IO[str] = out if out is not None else sys.stderr
    log_path = Path(config.log_path)
    bar = RunProgress(stream, config.max_steps, eval_keys=curve_keys, every=progress_every) if progress else None
    outcome = _Outcome()
    started = time.monotonic()
    config_errors: list[ConfigError] = []
    failures: BaseExceptionGroup[Exception] | None = None
    _hand_signals_to_trio()
    # The command line owns its process, so it may set the collector's policy.
    tune_gc_for_training()
    try:
        trio.run(_run, config, dataset, backend, evaluators, _Watchers(bar, sinks), outcome, stream)
    except* KeyboardInterrupt:
        # Ctrl-C before the watcher was listening.
        outcome.stopped_by = outcome.stopped_by or signal.SIGINT
    except* ConfigError as group:
        config_errors = config_error_leaves(group)
    except* Exception as group:
        failures = group
    finally:
        _ignore_stop_signals_until_reported()
        if bar is not None:
            bar.close()
        close_sinks(sinks)
    try:
        return _report(outcome, config_errors, failures, log_path, curve_keys, started, stream, debug)
    finally:
        _restore_stop_signals()


def _report(
    outcome: _Outcome,
    config_errors: list[ConfigError],
    failures: BaseExceptionGroup[Exception] | None,
    log_path: Path,
    curve_keys: Sequence[str],
    started: float,
    stream: IO[str],
    debug: bool,
) -> int:
    """Say how the run ended, in one line (or one per error), and return the exit code."""
    if config_errors:
        for error in config_errors:
            stream.write(f"error: {error}\n")
        return EXIT_CONFIG_ERROR
    if failures is not None:
        return _report_failure(failures, log_path, stream, debug or os.environ.get(DEBUG_ENV) == "1")
    curve = write_curves(log_path, curve_keys)
    checkpoint = CheckpointLog(log_path).last()
    elapsed = _clock(time.monotonic() - started)
    if outcome.interrupted or outcome.result is None:
        where = (
            f"checkpoint of step {checkpoint.step} at {checkpoint.state_path} (resume with --resume)"
            if checkpoint is not None
            else "no checkpoint was saved"
        )
        stream.write(f"stopped after {elapsed}: {where}\n")
        stream.flush()
        return outcome.exit_code
    summary = _summary(outcome.result, elapsed, curve_keys)
    if checkpoint is not None:
        summary.append(f"checkpoint {checkpoint.state_path}")
    if curve is not None:
        summary.append(f"curve {curve}")
    stream.write("; ".join(summary) + "\n")
    stream.flush()
    return EXIT_OK


def exit_quietly_on_stop_signals() -> None:
    """Until the run starts, make Ctrl-C exit with 130 and SIGTERM with 143, without a traceback.

    Call it first thing in a script, before the slow imports (torch takes seconds);
    :func:`run_cli` takes the signals over for the run itself.
    """
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, lambda signum, frame: sys.exit(EXIT_INTERRUPTED))
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(EXIT_TERMINATED))


def _hand_signals_to_trio() -> None:
    # Trio turns SIGINT into a KeyboardInterrupt at a safe point only when it
    # finds Python's default handler; a SIGTERM that lands before the watcher
    # listens must not raise inside Trio's scheduler, so it is only noted.
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: _EARLY_SIGNALS.append(signum))


def _ignore_stop_signals_until_reported() -> None:
    # After the run the save is done (or abandoned); what is left takes a moment
    # (the curve, one line), and a press now must not cut that line off.
    if threading.current_thread() is not threading.main_thread():
        return
    _EARLY_SIGNALS.clear()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _restore_stop_signals() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _report_failure(failures: BaseExceptionGroup[Exception], log_path: Path, stream: IO[str], debug: bool) -> int:
    """One line per distinct error, the traceback written to ``error.log``; return :data:`EXIT_ERROR`."""
    text = "".join(traceback.format_exception(failures))
    log = log_path / ERROR_LOG
    try:
        log.write_text(text)
        where = f"full traceback in {log}"
    except OSError:
        where = "the traceback could not be written; rerun with --debug to see it"
    for error in _distinct_leaves(failures):
        stream.write(f"error: {type(error).__name__}: {error}\n")
    stream.write(f"{where}\n")
    if debug:
        stream.write(text)
    stream.flush()
    return EXIT_ERROR


E = TypeVar("E", bound=Exception)


def _distinct_leaves(group: BaseExceptionGroup[E]) -> list[E]:
    """The leaves of a (possibly nested) group, each exception object once."""
    leaves: list[E] = []
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            leaves += _distinct_leaves(error)  # pyright: ignore[reportUnknownArgumentType]
        elif not any(error is seen for seen in leaves):
            leaves.append(error)
    return leaves


@dataclass
class Experiment:
    """What an example builds from its flags: the data, the evaluators, and what to plot.

    Attributes:
        dataset: the run's dataset.
        evaluators: evaluators of the weights.
        curve_keys: evaluation metrics to show in the progress and plot beside the reward.
        config_overrides: :class:`Config` fields the example sets itself.
    """

    dataset: RLDataset
    evaluators: Sequence[SamplingClientEvaluator] = ()
    curve_keys: Sequence[str] = ()
    config_overrides: dict[str, Any] = field(default_factory=lambda: {})


def run_example(
    cls: type[A],
    build: Callable[[A, LazyTokenizer], Experiment],
    argv: Sequence[str] | None = None,
    *,
    alphabet: str,
    description: str = "",
    out: IO[str] | None = None,
    **defaults: Any,
) -> int:
    """An example's ``main``: flags, backend, ``build``, a checked config, then :func:`run_cli`.

    Args:
        cls: the example's flags.
        build: makes the example's :class:`Experiment` from the flags and the tokenizer.
        argv, description, defaults: as for :func:`parse_args`.
        alphabet: the local backend's characters.
        out: where messages go (default: stderr).

    Returns:
        The exit code: 0 done, 2 invalid configuration (its message printed), 130 Ctrl-C.
    """
    stream: IO[str] = out if out is not None else sys.stderr
    args = parse_args(cls, argv, description=description, **defaults)
    try:
        backend, tokenizer = make_backend(args, alphabet=alphabet)
        experiment = build(args, tokenizer)
        config = make_config(args, **experiment.config_overrides)
        # Fail before any work (or a sink's run) starts; dataset-dependent checks come from train().
        config.validate()
        sinks = open_sinks(
            args.log_to,
            Path(config.log_path),
            config=config.to_json(),
            wandb_project=args.wandb_project,
            wandb_mode=args.wandb_mode,
        )
    except ConfigError as error:
        stream.write(f"error: {error}\n")
        return EXIT_CONFIG_ERROR
    return run_cli(
        config,
        dataset=experiment.dataset,
        backend=backend,
        evaluators=experiment.evaluators,
        curve_keys=experiment.curve_keys,
        progress=args.progress,
        progress_every=args.progress_every,
        sinks=sinks,
        out=stream,
        debug=args.debug,
    )
