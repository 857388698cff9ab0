"""The cookbook side: tinker-cookbook 0.6.1's own RL loop on fake Tinker clients.

Runs in ``.vs-cookbook-venv`` (``setup_env.sh``), never imports trio_rl. One call trains
one cell in one mode and prints a JSON line of measurements; ``run.py`` drives it.

The loop is the cookbook's: ``tinker_cookbook.rl.train.do_sync_training`` or
``do_async_training``, called with the arguments its ``main()`` would build (a
``CheckpointManager``, a ``CostTracker``, the rollout strategy the config resolves to,
the dataset wrapped in ``EpochCycledRLDataset``), followed by the final cumulative-token
row and final checkpoint ``main()`` writes. What is faked is the Tinker service, the
tokenizer and the envs, on the work model of ``bench/pipeline.py`` and
``trio_rl.testing``:

- ``sample`` sleeps S (``asyncio.sleep``), then returns one sequence of 1..max_tokens
  tokens drawn from a vocabulary of 32, with logprobs in [-3, 0);
- ``forward_backward`` and ``optim_step`` are queued in submission order on one
  "service" that takes T per ``forward_backward`` and nothing for the rest; every
  Datum gets a ``logprobs`` output as long as its input;
- an env's prompt is the 3 tokens ``[1 + batch, 2 + group, 3 + index]``; its one step
  rewards the fraction of even tokens in the action; group rewards add 0.

Only ``metrics.jsonl`` (the cookbook's ``JsonLogger``) and ``checkpoints.jsonl`` are
written: no console table, no logtree HTML, no rollout JSON export.

With ``--longtail`` the work model is instead ``bench/longtail_workload.py``'s (issue 20):
8 groups x 8 samples per step, each response's length drawn from its prompt's first
three tokens and its sample index, a sampler of 128 slots at 0.5 ms per token
(:class:`SlotSampler`, the model of ``trio_rl.testing.FakeSamplerModel``'s ``slots``
and ``token_latency``), ``forward_backward`` 0.1 s, ``max_tokens`` 4,096.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import heapq
import itertools
import json
import math
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import chz
import numpy as np
import tinker
from tinker import types
from tinker_cookbook import checkpoint_utils
from tinker_cookbook.rl import train as cookbook_train
from tinker_cookbook.rl.dataset_utils import EpochCycledRLDataset
from tinker_cookbook.rl.rollouts import RolloutErrorCounter
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.utils import ml_log
from tinker_cookbook.utils.cost_estimation import CostTracker

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for bench.x, as in bench/longtail.py
from bench import longtail_workload

VOCAB_SIZE = 32
MAX_TOKENS = 8
LEARNING_RATE = 1e-4


# ------------------------------------------------------------------ the fake service


class SlotSampler:
    """A sampler that produces ``slots`` sequences at once, ``token_s`` seconds per token, first come first served.

    Every duration is known when its request arrives, so the request simply takes
    the slot that frees first: that is first-come-first-served queueing, the
    model of ``trio_rl.testing.FakeBackend`` with ``FakeSamplerModel(slots=...)``. Ends follow
    from the schedule, not from when the event loop woke a sequence up, so the
    loop's own latency is paid by the loop and does not pile up in the sampler.
    """

    def __init__(self, slots: int, token_s: float) -> None:
        self.token_s = token_s
        self._free = [-math.inf] * slots
        self.busy_s = 0.0
        """Slot-seconds held, for the utilisation."""

    def schedule(self, now: float, length: int) -> float:
        """Queue one sequence of ``length`` tokens arriving ``now``; return when it ends."""
        start = max(now, heapq.heappop(self._free))
        end = start + length * self.token_s
        heapq.heappush(self._free, end)
        self.busy_s += end - start
        return end


class Ledger:
    """What the fake service was asked to do, and its latencies."""

    def __init__(self, sample_s: float, train_s: float, seed: int, sampler: SlotSampler | None = None) -> None:
        self.sample_s = sample_s
        self.train_s = train_s
        self.seed = seed
        self.sampler = sampler
        self.draw = 0
        """Long-tail runs: which set of lengths (``bench/longtail_workload.py``)."""
        self.calls: Counter[str] = Counter()
        self.trained_datums = 0
        self.trained_tokens = 0
        self.sequence_ids = itertools.count()
        self.sampled: dict[tuple[int, ...], tuple[int, int]] = {}
        """Long-tail runs: each env's prompt -> (weights version, response length) of its latest sample."""
        self.lags: Counter[int] = Counter()
        """Long-tail runs: trained tokens by lag (training step - the version that sampled them)."""
        self.staleness: list[int] = []
        """Long-tail runs: each trained group's staleness, in training order."""


class Pending:
    """An awaitable result that is ready at a given loop time (as a Tinker APIFuture is awaitable)."""

    def __init__(self, ready_at: float, value: Any) -> None:
        self._ready_at = ready_at
        self._value = value

    def __await__(self) -> Any:
        return self._wait().__await__()

    async def _wait(self) -> Any:
        delay = self._ready_at - asyncio.get_running_loop().time()
        await asyncio.sleep(max(0.0, delay))
        return self._value


def _done(value: Any) -> concurrent.futures.Future[Any]:
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    future.set_result(value)
    return future


class FakeSamplingClient:
    def __init__(self, ledger: Ledger, version: int) -> None:
        self._ledger = ledger
        self.version = version
        self._requests = 0

    async def sample(
        self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams, **_: Any
    ) -> types.SampleResponse:
        ledger = self._ledger
        ledger.calls["sample"] += 1
        self._requests += 1
        # Seeded by (seed, weights version, request number): reproducible, independent of the prompt.
        rng = random.Random((ledger.seed * 1_000_003 + self.version) * 1_000_003 + self._requests)
        await asyncio.sleep(ledger.sample_s)
        max_tokens = sampling_params.max_tokens or 16
        lengths = [rng.randint(1, max_tokens) for _ in range(num_samples)]
        if ledger.sampler is not None:
            prompt_tokens = prompt.to_ints()
            lengths = [
                min(max_tokens, longtail_workload.response_length(prompt_tokens, i, ledger.draw))
                for i in range(num_samples)
            ]
            loop = asyncio.get_running_loop()
            ends = [ledger.sampler.schedule(loop.time(), n) for n in lengths]
            await asyncio.sleep(max(0.0, max(ends) - loop.time()))
            ledger.sampled[tuple(prompt_tokens[:3])] = (self.version, lengths[0])
        sequences = []
        for n in lengths:
            tokens = rng.choices(range(VOCAB_SIZE), k=n)
            logprobs = [-3 * rng.random() for _ in range(n)]
            sequences.append(
                types.SampledSequence(
                    stop_reason="stop" if n < max_tokens else "length",
                    sequence_id=f"fake-{next(ledger.sequence_ids)}",
                    tokens_np=np.asarray(tokens, dtype=np.int32),
                    logprobs_np=np.asarray(logprobs, dtype=np.float32),
                )
            )
        return types.SampleResponse(sequences=sequences)


class FakeTrainingClient:
    """One request at a time, in submission order; the weights are a version number."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self.version = 0
        self._busy_until = -math.inf

    def _queue(self, kind: str, latency: float, value: Any) -> Pending:
        self._ledger.calls[kind] += 1
        now = asyncio.get_running_loop().time()
        self._busy_until = max(self._busy_until, now) + latency
        return Pending(self._busy_until, value)

    def forward_backward(
        self, data: Sequence[types.Datum], loss_fn: str, loss_fn_config: dict[str, Any] | None = None
    ) -> Pending:
        ledger = self._ledger
        lengths = [d.model_input.length for d in data]
        ledger.trained_datums += len(data)
        if ledger.sampler is not None:
            # This client's version is the step being trained (optim_step adds one).
            groups: dict[tuple[int, ...], int] = {}
            for datum in data:
                prompt = tuple(datum.model_input.to_ints()[:3])
                version, tokens = ledger.sampled[prompt]
                ledger.lags[self.version - version] += tokens
                groups[prompt[:2]] = version  # a group's envs share one sampling client
            ledger.staleness.extend(self.version - v for _, v in sorted(groups.items()))
        ledger.trained_tokens += sum(lengths)
        outputs = [
            {"logprobs": types.TensorData(data=np.full(n, -0.5, dtype=np.float32), dtype="float32")} for n in lengths
        ]
        value = types.ForwardBackwardOutput(
            loss_fn_output_type="TensorData", loss_fn_outputs=outputs, metrics={"loss:sum": 0.5 * sum(lengths)}
        )
        return self._queue("forward_backward", ledger.train_s, value)

    def optim_step(self, adam_params: types.AdamParams) -> Pending:
        self.version += 1
        return self._queue("optim_step", 0.0, types.OptimStepResponse(metrics={"lr": adam_params.learning_rate}))

    def save_state(self, name: str, ttl_seconds: int | None = None) -> Pending:
        return self._queue("save_state", 0.0, types.SaveWeightsResponse(path=f"tinker://fake/weights/{name}"))

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None) -> Pending:
        path = f"tinker://fake/sampler_weights/{self.version}/{name}"
        return self._queue("save_weights_for_sampler", 0.0, types.SaveWeightsForSamplerResponse(path=path))

    def create_sampling_client(self, model_path: str, **_: Any) -> concurrent.futures.Future[FakeSamplingClient]:
        version = int(model_path.split("/")[-2])
        return _done(FakeSamplingClient(self._ledger, version))

    async def save_weights_and_get_sampling_client(self, **_: Any) -> FakeSamplingClient:
        await self._queue("save_weights_for_sampler", 0.0, None)
        return FakeSamplingClient(self._ledger, self.version)


class CharTokenizer:
    """Token ids as code points: enough for the cookbook's logging of a group."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, tokens: Sequence[int], **_: Any) -> str:
        return "".join(chr(32 + int(t)) for t in tokens)


# ------------------------------------------------------------------ the fake envs


def _tokens(ints: list[int]) -> types.ModelInput:
    # As trio_rl's fake env builds them: no per-token validation.
    chunk = types.EncodedTextChunk.model_construct(tokens=ints, type="encoded_text")
    return types.ModelInput.model_construct(chunks=[chunk])


class EvenTokensEnv(Env):
    def __init__(self, key: tuple[int, int], index: int) -> None:
        self.prompt = [1 + key[0], 2 + key[1], 3 + index]

    async def initial_observation(self) -> tuple[types.ModelInput, list[int]]:
        return _tokens(list(self.prompt)), [0]

    async def step(self, action: list[int], *, extra: Any = None) -> StepResult:
        reward = sum(1 for t in action if t % 2 == 0) / max(1, len(action))
        return StepResult(
            reward=reward,
            episode_done=True,
            next_observation=_tokens([*self.prompt, *action, 5]),
            next_stop_condition=[0],
            metrics={"even_frac": reward},
        )


class EvenTokensGroup(EnvGroupBuilder):
    def __init__(self, key: tuple[int, int], group_size: int) -> None:
        self.key = key
        self.group_size = group_size

    async def make_envs(self) -> Sequence[Env]:
        return [EvenTokensEnv(self.key, i) for i in range(self.group_size)]

    async def compute_group_rewards(
        self, trajectory_group: list[Any], env_group: Sequence[Env]
    ) -> list[tuple[float, Any]]:
        return [(0.0, {"group_size": len(trajectory_group)}) for _ in trajectory_group]

    def logging_tags(self) -> list[str]:
        return ["even" if self.key[1] % 2 == 0 else "odd"]


class EvenTokensDataset(RLDataset):
    def __init__(self, num_batches: int, groups_per_batch: int, group_size: int) -> None:
        self.num_batches = num_batches
        self.groups_per_batch = groups_per_batch
        self.group_size = group_size

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [EvenTokensGroup((index, g), self.group_size) for g in range(self.groups_per_batch)]


@chz.chz
class EvenTokensDatasetBuilder(RLDatasetBuilder):
    """Only so that ``Config`` is complete; the driver builds the dataset itself."""

    num_batches: int
    groups_per_batch: int
    group_size: int

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return EvenTokensDataset(self.num_batches, self.groups_per_batch, self.group_size), None


# ------------------------------------------------------------------ one run


async def run(args: argparse.Namespace, log_path: Path) -> dict[str, Any]:
    sampler = SlotSampler(longtail_workload.SAMPLE_SLOTS, longtail_workload.TOKEN_LATENCY_S) if args.longtail else None
    ledger = Ledger(args.sample_s, args.train_s, args.seed, sampler)
    ledger.draw = args.draw
    builder = EvenTokensDatasetBuilder(
        num_batches=args.steps, groups_per_batch=args.groups_per_step, group_size=args.group_size
    )
    async_config = None
    if args.mode == "async":
        # The same loss as trio_rl's default, instead of the async default stable_reinforce.
        async_config = cookbook_train.AsyncConfig(
            max_steps_off_policy=args.k, groups_per_batch=args.groups_per_step, loss_fn="importance_sampling"
        )
    config = cookbook_train.Config(
        learning_rate=LEARNING_RATE,
        dataset_builder=builder,
        model_name="fake/model",
        recipe_name="vs_cookbook",
        max_tokens=longtail_workload.MAX_TOKENS if args.longtail else MAX_TOKENS,
        log_path=str(log_path),
        eval_every=0,
        save_every=0,
        num_groups_to_log=0,
        rollout_json_export=False,
        rollout_error_tolerance=False,
        async_config=async_config,
    )

    wall = time.perf_counter()
    cpu = time.process_time()
    # What main() sets up around the loop, with the service, tokenizer and pricing faked.
    ml_logger = ml_log.JsonLogger(str(log_path))
    training_client = FakeTrainingClient(ledger)
    dataset, _ = await builder()
    strategy = config.effective_rollout_strategy()
    error_counter = RolloutErrorCounter() if strategy.catches_group_errors else None
    cost_tracker = CostTracker(None)
    end_batch = len(dataset)
    checkpoint_mgr = checkpoint_utils.CheckpointManager(
        training_client=training_client,  # type: ignore[arg-type]
        service_client=None,  # type: ignore[arg-type]
        log_path=str(log_path),
        save_every=config.save_every,
        ttl_seconds=config.ttl_seconds,
        rolling_save_every=config.rolling_save_every,
        rolling_ttl_seconds=config.rolling_ttl_seconds,
        store=ml_logger.store,
    )
    training_func = cookbook_train.do_async_training if async_config else cookbook_train.do_sync_training
    await training_func(
        start_batch=0,
        end_batch=end_batch,
        num_batches=end_batch,
        config=config,
        training_client=training_client,  # type: ignore[arg-type]
        kl_reference_client=None,
        evaluators=[],
        dataset=EpochCycledRLDataset(dataset, config.num_epochs),
        ml_logger=ml_logger,
        tokenizer=CharTokenizer(),  # type: ignore[arg-type]
        error_counter=error_counter,
        strategy=strategy,
        checkpoint_mgr=checkpoint_mgr,
        cost_tracker=cost_tracker,
    )
    ml_logger.log_metrics(cost_tracker.cumulative_metrics(), step=end_batch)
    await checkpoint_mgr.save_final_async(loop_state={"batch": end_batch})
    ml_logger.close()
    cpu = time.process_time() - cpu
    wall = time.perf_counter() - wall

    if ledger.trained_datums % args.group_size:
        raise RuntimeError(f"trained {ledger.trained_datums} datums, not a multiple of {args.group_size}")
    return {
        "side": "cookbook",
        "makespan": wall,
        "cpu_s": cpu,
        "trained_groups": ledger.trained_datums // args.group_size,
        "samples": ledger.calls["sample"],
        "trained_datums": ledger.trained_datums,
        "trained_tokens": ledger.trained_tokens,
        "calls": dict(ledger.calls),
        **(longtail_measures(ledger, wall) if sampler is not None else {}),
    }


def longtail_measures(ledger: Ledger, makespan: float) -> dict[str, Any]:
    """What ``bench/longtail.py`` reports besides the makespan: utilisation, staleness, token lag."""
    assert ledger.sampler is not None
    tokens = sum(ledger.lags.values())
    return {
        "sampler_utilisation": ledger.sampler.busy_s / (longtail_workload.SAMPLE_SLOTS * makespan),
        "staleness_mean": sum(ledger.staleness) / max(1, len(ledger.staleness)),
        "staleness_max": max(ledger.staleness, default=0),
        "token_lag_mean": sum(lag * n for lag, n in ledger.lags.items()) / max(1, tokens),
        "token_lag_max": max(ledger.lags, default=0),
        "sampled_tokens": sum(length for _, length in ledger.sampled.values()),
    }


def run_and_describe(args: argparse.Namespace, log_path: Path) -> dict[str, Any]:
    """Run, then add what the run folder holds: steps logged, metrics rows, file sizes."""
    result = asyncio.run(run(args, log_path))
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    result["steps"] = sum(1 for r in rows if "optim/lr" in r)
    result["metrics_rows"] = len(rows)
    result["files"] = {p.name: p.stat().st_size for p in sorted(log_path.iterdir()) if p.is_file()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["sync", "async"], required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--sample-s", type=float, help="seconds per sample call (required without --longtail)")
    parser.add_argument("--train-s", type=float, help="seconds per forward_backward (required without --longtail)")
    parser.add_argument("--k", type=int, default=1, help="max_steps_off_policy in async mode")
    parser.add_argument("--groups-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--longtail", action="store_true", help="the long-tail workload (bench/longtail_workload.py)")
    parser.add_argument("--draw", type=int, default=0, help="--longtail: another set of lengths, same distribution")
    parser.add_argument("--log-path", type=Path, help="keep the run folder here (default: a temporary one)")
    args = parser.parse_args()
    if args.longtail:
        args.sample_s, args.train_s = 0.0, longtail_workload.TRAIN_S
        args.groups_per_step, args.group_size = longtail_workload.GROUPS_PER_STEP, longtail_workload.GROUP_SIZE
    elif args.sample_s is None or args.train_s is None:
        parser.error("--sample-s and --train-s are required without --longtail")
    if args.log_path is not None:
        args.log_path.mkdir(parents=True, exist_ok=False)
        result = run_and_describe(args, args.log_path)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_and_describe(args, Path(tmp))
    result["versions"] = {"tinker": tinker.__version__, "python": sys.version.split()[0]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
