"""Command-line plumbing shared by the examples: flags, backend, progress bar, Ctrl-C.

An example declares its flags as a dataclass deriving from :class:`CommonArgs`
and ends with::

    args = parse_args(Args, argv)
    backend, tokenizer = make_backend(args, alphabet="0123456789+=")
    ...build the dataset and evaluators from the tokenizer...
    return run_cli(make_config(args), dataset=dataset, backend=backend, evaluators=evaluators)

:func:`run_cli` runs :func:`trio_rl.train` under ``trio.run`` with a progress
bar on stderr read live from :attr:`RunHandle.metrics`, writes
``reward_curve.png`` into the run folder, and turns Ctrl-C into a clean stop: the
run's scope is cancelled, the trainer saves the last completed step
(``Config.save_on_cancel``), one line says where that checkpoint is, and the
exit code is 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self, TypeVar

import trio

from .backends.protocol import Backend, Tokenizer, TrainingClient
from .checkpoint import CheckpointLog
from .config import AsyncConfig, Config, StreamMinibatchConfig
from .errors import ConfigError
from .evaluation import SamplingClientEvaluator
from .train import METRICS_FILE, RunHandle, TrainResult, train
from .types import RLDataset

EXIT_OK = 0
EXIT_CONFIG_ERROR = 2
EXIT_INTERRUPTED = 130
"""128 + SIGINT, what shells report for a program stopped by Ctrl-C."""

CURVE_FILE = "reward_curve.png"
REWARD_KEY = "env/all/reward/total"

A = TypeVar("A", bound="CommonArgs")


def flag(default: Any, help: str) -> Any:
    """A dataclass field that becomes a ``--flag`` with ``help``."""
    return field(default=default, metadata={"help": help})


@dataclass
class CommonArgs:
    """Flags every example understands; examples subclass it to change defaults and add their own."""

    log_path: str = flag("runs/example", "run folder: metrics.jsonl, checkpoints, reward_curve.png")
    mode: str = flag("async", "sync (on-policy), stream (on-policy, minibatches streamed) or async (off-policy)")
    staleness: str = flag("requeue", "async only: requeue groups more than K steps stale, or pace sampling to never exceed K")
    max_steps_off_policy: int = flag(1, "async only: K, how many steps stale a trained group may be")
    num_minibatches: int = flag(2, "stream only: minibatches per step (must divide --groups-per-batch)")
    groups_per_batch: int = flag(8, "groups (problems) per training step")
    group_size: int = flag(8, "samples per group; rewards are centred within a group")
    learning_rate: float = flag(1e-3, "Adam learning rate")
    adam_beta2: float = flag(0.95, "Adam's second-moment decay")
    loss_fn: str = flag("importance_sampling", "importance_sampling, ppo, cispo or dro")
    temperature: float = flag(1.0, "sampling temperature of rollouts")
    max_tokens: int = flag(16, "most tokens per sampled action")
    max_steps: int = flag(100, "training steps")
    eval_every: int = flag(10, "evaluate every N steps (0: only the final weights)")
    save_every: int = flag(50, "save a resumable checkpoint every N steps (0: only the final state)")
    seed: int = flag(0, "seed of the data, the initial weights and every rollout")
    resume: bool = flag(False, "continue from the last checkpoint in --log-path")
    backend: str = flag("local", "local (torch, in-process) or tinker (the Tinker service)")
    model: str | None = flag(None, "tinker: the base model to fine-tune (LoRA); local: a label only")
    base_url: str | None = flag(None, "tinker: service URL (default: TINKER_BASE_URL or the SDK's default)")
    lora_rank: int = flag(32, "tinker: LoRA rank")
    d_model: int = flag(64, "local: transformer width")
    n_layers: int = flag(2, "local: transformer blocks")
    n_heads: int = flag(4, "local: attention heads")
    max_seq_len: int = flag(64, "local: longest sequence the model accepts")
    progress: bool = flag(True, "show a progress bar on stderr")


# ---------------------------------------------------------------- flags


def parse_args(
    cls: type[A], argv: Sequence[str] | None = None, *, description: str = "", **defaults: Any
) -> A:
    """Build an ``argparse`` parser from the fields of ``cls`` and parse ``argv``.

    Args:
        cls: a dataclass deriving from :class:`CommonArgs`; each field is a
            ``--flag-name``; booleans get ``--flag``/``--no-flag``.
        argv: the arguments (``None``: ``sys.argv[1:]``).
        description: the ``--help`` header.
        **defaults: replace field defaults (flags in ``argv`` still win); tests use
            this to shrink a run.

    Returns:
        The parsed arguments as an instance of ``cls``.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(defaults) - names
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
    for f in dataclasses.fields(cls):
        default = defaults.get(f.name, f.default)
        option = "--" + f.name.replace("_", "-")
        help_text = f.metadata.get("help", "")
        if f.type in (bool, "bool"):
            parser.add_argument(option, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        else:
            parser.add_argument(option, type=_parser_type(f.type, default), default=default, help=help_text)
    namespace = parser.parse_args(argv)
    return cls(**vars(namespace))


def _parser_type(annotation: Any, default: Any) -> Callable[[str], Any]:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    for name, kind in (("int", int), ("float", float)):
        if text.startswith(name):
            return kind
    if isinstance(default, bool):
        raise TypeError("booleans are handled separately")
    return str


def make_config(args: CommonArgs, **overrides: Any) -> Config:
    """The run's :class:`Config` from the common flags; ``overrides`` set any other field.

    Raises:
        ConfigError: for an unknown ``--mode`` (other fields are checked by :func:`train`).
    """
    async_config = None
    stream_config = None
    if args.mode == "async":
        async_config = AsyncConfig(args.max_steps_off_policy, args.groups_per_batch, args.staleness)  # type: ignore[arg-type]
    elif args.mode == "stream":
        stream_config = StreamMinibatchConfig(args.groups_per_batch, args.num_minibatches)
    elif args.mode != "sync":
        raise ConfigError("mode", f"unknown mode {args.mode!r}; use sync, stream or async")
    values: dict[str, Any] = dict(
        log_path=args.log_path,
        base_model=args.model or "trio-rl-tiny",
        lora_rank=args.lora_rank,
        learning_rate=args.learning_rate,
        adam_beta2=args.adam_beta2,
        loss_fn=args.loss_fn,
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        max_steps=args.max_steps,
        eval_every=args.eval_every,
        save_every=args.save_every,
        seed=args.seed,
        resume=args.resume,
        async_config=async_config,
        stream_minibatch_config=stream_config,
        save_on_cancel=True,
    )
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
        return self.get().encode(text)

    def decode(self, tokens: Sequence[int]) -> str:
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
        return await self._bound(await self._inner.create_training_client_from_state(path, with_optimizer=with_optimizer))


def make_backend(args: CommonArgs, *, alphabet: str) -> tuple[Backend, LazyTokenizer]:
    """The backend named by ``--backend`` and the tokenizer envs should use.

    Args:
        args: the parsed flags.
        alphabet: for ``local``, the characters of the :class:`CharTokenizer`.

    Returns:
        The (not yet entered) backend and a :class:`LazyTokenizer`: bound at once
        for ``local``, once the training client exists for ``tinker``.

    Raises:
        ConfigError: for an unknown backend or ``tinker`` without ``--model``.
    """
    if args.backend == "local":
        from .backends.local import CharTokenizer, LocalBackend, ModelConfig

        tokenizer = CharTokenizer(alphabet)
        model_config = ModelConfig(
            d_model=args.d_model,
            n_layers=args.n_layers,
            n_heads=args.n_heads,
            d_ff=4 * args.d_model,
            max_seq_len=args.max_seq_len,
        )
        backend = LocalBackend(log_dir=args.log_path, model_config=model_config, tokenizer=tokenizer, seed=args.seed)
        return backend, LazyTokenizer(tokenizer)
    if args.backend == "tinker":
        if not args.model:
            raise ConfigError("model", "--backend tinker needs --model <base model name>, e.g. meta-llama/Llama-3.2-1B")
        from .backends.tinker import TinkerBackend

        lazy = LazyTokenizer()
        return _BindTokenizer(TinkerBackend(base_url=args.base_url), lazy), lazy
    raise ConfigError("backend", f"unknown backend {args.backend!r}; use local or tinker")


# ---------------------------------------------------------------- progress


class ProgressBar:
    """One status line on a terminal (redrawn in place), or a line every few steps elsewhere.

    Shows the step, the mean reward of the step's groups, the latest evaluation,
    the largest staleness of the step's groups, and throughput.
    """

    def __init__(
        self,
        out: IO[str],
        total_steps: int | None,
        eval_keys: Sequence[str] = (),
        every: int = 10,
    ) -> None:
        self.out = out
        self.total_steps = total_steps
        self.eval_keys = list(eval_keys)
        self.tty = out.isatty()
        self.every = every
        self.started = time.monotonic()
        self.tokens = 0
        self.last_eval: dict[str, float] = {}
        self.last_line = ""

    def update(self, record: dict[str, Any]) -> None:
        """Show one metrics record (a training step, or the final one)."""
        for key in self.eval_keys:
            if record.get(key) is not None:
                self.last_eval[key] = record[key]
        if "progress/groups" not in record:
            return
        self.tokens += int(record.get("env/all/total_ac_tokens", 0)) + int(record.get("env/all/total_ob_tokens", 0))
        elapsed = max(1e-9, time.monotonic() - self.started)
        step = record["step"] + 1
        total = f"/{self.total_steps}" if self.total_steps else ""
        reward = record.get(REWARD_KEY)
        parts = [
            f"step {step}{total}",
            f"reward {reward:.3f}" if isinstance(reward, float) else "reward -",
        ]
        parts += [f"{_short(k)} {v:.3f}" for k, v in self.last_eval.items()]
        parts += [
            f"stale<={record.get('async/staleness_max', 0)}",
            f"{record.get('progress/trained_groups', 0) / elapsed:.1f} groups/s",
            f"{self.tokens / elapsed / 1000:.1f}k tok/s",
            _clock(elapsed),
        ]
        self.last_line = " | ".join(parts)
        if self.tty:
            self.out.write("\r\x1b[2K" + self.last_line)
            self.out.flush()
        elif step % self.every == 0 or step == self.total_steps:
            self.out.write(self.last_line + "\n")
            self.out.flush()

    def close(self) -> None:
        """End the status line."""
        if self.tty and self.last_line:
            self.out.write("\n")
            self.out.flush()


def _short(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


# ---------------------------------------------------------------- the curve


def write_reward_curve(log_path: Path, extra_keys: Sequence[str] = ()) -> Path | None:
    """Plot ``env/all/reward/total`` (and ``extra_keys``) from ``metrics.jsonl`` into ``reward_curve.png``.

    Returns:
        The PNG's path, or None when there is nothing to plot yet.
    """
    from .plotting import Series, plot_series

    path = log_path / METRICS_FILE
    if not path.exists():
        return None
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    series: list[Series] = []
    palette = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189)]
    for index, key in enumerate([REWARD_KEY, *extra_keys]):
        # A step's record holds the metrics of training step `step` and the
        # evaluation of the weights after `step` steps; both plot at their own x.
        if key.startswith("eval/"):
            points = [(float(r["step"]), float(r[key])) for r in records if isinstance(r.get(key), (int, float))]
        else:
            points = [
                (float(r["step"]), float(r[key]))
                for r in records
                if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) and "progress/groups" in r
            ]
        if points:
            series.append(Series(label=key, points=points, color=palette[index % len(palette)]))
    if not series:
        return None
    out = log_path / CURVE_FILE
    plot_series(out, series, x_label="step", y_range=(0.0, 1.0))
    return out


# ---------------------------------------------------------------- running


@dataclass
class _Outcome:
    result: TrainResult | None = None
    interrupted: bool = False


async def _watch_for_ctrl_c(run_scope: trio.CancelScope, outcome: _Outcome, out: IO[str], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Turn the first SIGINT into a cancel of the run; a second one raises KeyboardInterrupt
    (the save already under way still runs, bounded by ``Config.cancel_save_timeout``)."""
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            if outcome.interrupted:
                raise KeyboardInterrupt
            outcome.interrupted = True
            out.write("\ninterrupted: saving the last completed step\n")
            out.flush()
            run_scope.cancel()


async def _run(
    config: Config,
    dataset: RLDataset,
    backend: Backend,
    evaluators: Sequence[SamplingClientEvaluator],
    progress: ProgressBar | None,
    outcome: _Outcome,
    out: IO[str],
) -> None:
    run_scope = trio.CancelScope()

    async def train_into_outcome(*, task_status: trio.TaskStatus[RunHandle] = trio.TASK_STATUS_IGNORED) -> None:
        outcome.result = await train(config, dataset=dataset, backend=backend, evaluators=evaluators, task_status=task_status)

    async with trio.open_nursery() as outer:
        await outer.start(_watch_for_ctrl_c, run_scope, outcome, out)
        # The backend is entered outside the run's scope: a cancelled run still
        # needs the backend's workers to save its last step.
        async with backend:
            with run_scope:
                async with trio.open_nursery() as run_nursery:
                    handle: RunHandle = await run_nursery.start(train_into_outcome)
                    try:
                        async for record in handle.metrics:
                            if progress is not None:
                                progress.update(record)
                    finally:
                        if progress is not None:
                            progress.close()
        outer.cancel_scope.cancel()


def run_cli(
    config: Config,
    *,
    dataset: RLDataset,
    backend: Backend,
    evaluators: Sequence[SamplingClientEvaluator] = (),
    curve_keys: Sequence[str] = (),
    progress: bool = True,
    out: IO[str] | None = None,
) -> int:
    """Train under ``trio.run`` with a progress bar and clean Ctrl-C; return the exit code.

    Args:
        config: the run's configuration (``save_on_cancel`` is forced on).
        dataset, backend, evaluators: as for :func:`trio_rl.train`; ``backend`` not yet entered.
        curve_keys: metrics plotted in ``reward_curve.png`` beside the mean reward.
        progress: show the progress bar.
        out: where progress and messages go (default: stderr).

    Returns:
        0 when the run finished, 130 when Ctrl-C stopped it, 2 for an invalid configuration.
    """
    out = out if out is not None else sys.stderr
    if not config.save_on_cancel:
        config = dataclasses.replace(config, save_on_cancel=True)
    log_path = Path(config.log_path)
    bar = ProgressBar(out, config.max_steps, eval_keys=curve_keys) if progress else None
    outcome = _Outcome()
    started = time.monotonic()
    config_errors: list[BaseException] = []
    try:
        trio.run(_run, config, dataset, backend, evaluators, bar, outcome, out)
    except* KeyboardInterrupt:
        # Ctrl-C before the watcher was listening, or a second one.
        outcome.interrupted = True
    except* ConfigError as group:
        config_errors = list(group.exceptions)
    if config_errors:
        for error in config_errors:
            out.write(f"error: {error}\n")
        return EXIT_CONFIG_ERROR
    curve = write_reward_curve(log_path, curve_keys)
    checkpoint = CheckpointLog(log_path).last()
    elapsed = _clock(time.monotonic() - started)
    if outcome.interrupted or outcome.result is None:
        where = (
            f"checkpoint of step {checkpoint.step} at {checkpoint.state_path} (resume with --resume)"
            if checkpoint is not None
            else "no checkpoint was saved"
        )
        out.write(f"stopped after {elapsed}: {where}\n")
        out.flush()
        return EXIT_INTERRUPTED
    result = outcome.result
    summary = [f"done: {result.final_step} steps in {elapsed}"]
    steps = result.step_metrics
    if steps and isinstance(steps[-1].get(REWARD_KEY), float):
        summary.append(f"last reward {steps[-1][REWARD_KEY]:.3f}")
    for key in curve_keys:
        value = result.summary.get(key)
        if isinstance(value, (int, float)):
            summary.append(f"final {key} {value:.3f}")
    if checkpoint is not None:
        summary.append(f"checkpoint {checkpoint.state_path}")
    if curve is not None:
        summary.append(f"curve {curve}")
    out.write("; ".join(summary) + "\n")
    out.flush()
    return EXIT_OK
