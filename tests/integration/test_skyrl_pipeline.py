"""trio_rl.train end to end: a small RL run on a real SkyRL server through TinkerBackend.

The env is a toy arithmetic task ("What is 3 + 4? Answer:") tokenized with the
server model's own tokenizer (from a training client). The tiny random model
will not learn arithmetic in a few steps; these tests check the plumbing: steps
complete, each step samples from the weights the previous step produced,
metrics.jsonl is written, a saved run resumes at the right step from its state
path, and a bad request ends the run with a named error instead of a hang.

Shapes are kept fixed so that JAX compiles each kind of call once per server:
prompts and answers fit the 32-token bucket, and the server pads sampling
batches and splits training batches to fixed sizes (see ``skyrl_server``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import pytest
import trio
from skyrl_server import DUMMY_API_KEY, SkyRLServer
from tinker import types as tinker_types

import trio_rl
from trio_rl.backends.protocol import PendingResult, SamplingClient, Tokenizer, TrainingClient
from trio_rl.backends.tinker import RemoteTimeoutError, TinkerBackend, TinkerTimeouts
from trio_rl.loop.checkpoints import CheckpointLog

pytestmark = pytest.mark.integration

LORA_RANK = 8
GROUP_SIZE = 2
GROUPS_PER_BATCH = 2
MAX_TOKENS = 8
RUN_DEADLINE_S = 300.0
"""Absolute bound on one training run; the per-call deadlines below fire much sooner."""

TIMEOUTS = TinkerTimeouts(
    create_training_client=120, forward_backward=90, optim_step=90, sample=90, checkpoint=90, tokenizer=60
)

_tokenizer_cache: dict[str, Tokenizer] = {}


# --------------------------------------------------------------------------- the env


class ArithmeticEnv(trio_rl.Env):
    """One question ``a + b``; reward 1 for the right number, a little for any digits."""

    def __init__(self, prompt: list[int], answer: int, tokenizer: Tokenizer, stop: list[int]) -> None:
        self.prompt = prompt
        self.answer = answer
        self.tokenizer = tokenizer
        self.stop = stop

    async def initial_observation(self) -> tuple[trio_rl.Observation, trio_rl.StopCondition]:
        return tinker_types.ModelInput.from_ints(self.prompt), self.stop

    async def step(self, action: trio_rl.Action, *, extra: trio_rl.ActionExtra | None = None) -> trio_rl.StepResult:
        text = self.tokenizer.decode(action)
        correct = str(self.answer) in text
        # Shaping, so that a random model's group rewards differ and advantages are nonzero.
        digits = sum(ch.isdigit() for ch in text)
        reward = 1.0 if correct else 0.1 * min(digits, 5)
        return trio_rl.StepResult(
            reward=reward,
            episode_done=True,
            next_observation=tinker_types.ModelInput.from_ints(self.prompt + list(action)),
            next_stop_condition=self.stop,
            metrics={"correct": float(correct)},
        )


class ArithmeticGroup(trio_rl.EnvGroupBuilder):
    """``GROUP_SIZE`` copies of one question; records when its group finished."""

    def __init__(self, key: tuple[int, int], prompt: list[int], answer: int, dataset: ArithmeticDataset) -> None:
        self.key = key
        self.prompt = prompt
        self.answer = answer
        self.dataset = dataset

    async def make_envs(self) -> Sequence[trio_rl.Env]:
        return [self.make_one() for _ in range(GROUP_SIZE)]

    async def make_env(self, index: int) -> trio_rl.Env:
        return self.make_one()

    def make_one(self) -> ArithmeticEnv:
        return ArithmeticEnv(self.prompt, self.answer, self.dataset.tokenizer, self.dataset.stop)

    async def compute_group_rewards(
        self, trajectory_group: list[trio_rl.Trajectory], env_group: Sequence[trio_rl.Env]
    ) -> list[tuple[float, trio_rl.Metrics]]:
        self.dataset.finished.append(self.key)
        return [(0.0, {}) for _ in trajectory_group]

    def logging_tags(self) -> list[str]:
        return ["arith"]


class ArithmeticDataset(trio_rl.RLDataset):
    """``num_batches`` batches of ``GROUPS_PER_BATCH`` questions, fixed by (batch, group).

    ``bad_token`` (if given) is appended to every prompt: a token id the model
    does not have.
    """

    def __init__(self, tokenizer: Tokenizer, eos_token_id: int, num_batches: int, bad_token: int | None = None):
        self.tokenizer = tokenizer
        self.stop = [eos_token_id]
        self.num_batches = num_batches
        self.bad_token = bad_token
        self.finished: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[trio_rl.EnvGroupBuilder]:
        if not 0 <= index < self.num_batches:
            raise IndexError(index)
        builders = []
        for group in range(GROUPS_PER_BATCH):
            a, b = (7 * index + 3 * group) % 20, (5 * index + group + 1) % 10
            prompt = self.tokenizer.encode(f"What is {a} + {b}? Answer:")
            if self.bad_token is not None:
                prompt = [*prompt, self.bad_token]
            builders.append(ArithmeticGroup((index, group), prompt, a + b, self))
        return builders


# --------------------------------------------------------------------------- recording backend


class RecordingSamplingClient:
    """Delegates to a TinkerSamplingClient and records each sample call's weights name."""

    def __init__(self, inner: SamplingClient, name: str, log: list[str]) -> None:
        self.inner = inner
        self.name = name
        self.log = log

    @property
    def model_path(self) -> str | None:
        return self.inner.model_path

    async def sample(
        self, prompt: tinker_types.ModelInput, num_samples: int, sampling_params: tinker_types.SamplingParams
    ) -> tinker_types.SampleResponse:
        self.log.append(self.name)
        return await self.inner.sample(prompt, num_samples, sampling_params)

    async def compute_logprobs(self, prompt: tinker_types.ModelInput) -> list[float | None]:
        return await self.inner.compute_logprobs(prompt)


class RecordingTrainingClient:
    """Delegates to a TinkerTrainingClient; wraps the sampling clients it makes."""

    def __init__(self, inner: TrainingClient, recorder: RecordingBackend) -> None:
        self.inner = inner
        self.recorder = recorder

    async def forward_backward(
        self,
        data: Sequence[tinker_types.Datum],
        loss_fn: tinker_types.LossFnType,
        loss_fn_config: dict[str, float] | None = None,
    ) -> PendingResult[tinker_types.ForwardBackwardOutput]:
        return await self.inner.forward_backward(data, loss_fn, loss_fn_config)

    async def optim_step(self, adam_params: tinker_types.AdamParams) -> PendingResult[tinker_types.OptimStepResponse]:
        return await self.inner.optim_step(adam_params)

    async def save_weights_for_sampler(self, name: str, *, inflight: bool = False) -> SamplingClient:
        self.recorder.sampler_names.append(name)
        client = await self.inner.save_weights_for_sampler(name, inflight=inflight)
        return RecordingSamplingClient(client, name, self.recorder.samples)

    async def save_state(self, name: str) -> str:
        return await self.inner.save_state(name)

    async def load_state(self, path: str, *, with_optimizer: bool = True) -> None:
        await self.inner.load_state(path, with_optimizer=with_optimizer)

    async def get_tokenizer(self) -> Tokenizer:
        return await self.inner.get_tokenizer()


class RecordingBackend:
    """A TinkerBackend that records which clients the pipeline made and used."""

    def __init__(self, inner: TinkerBackend) -> None:
        self.inner = inner
        self.created: list[tuple[str, Any]] = []
        self.sampler_names: list[str] = []
        self.samples: list[str] = []

    async def __aenter__(self) -> Self:
        await self.inner.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.inner.__aexit__(exc_type, exc, tb)

    async def create_training_client(
        self, *, base_model: str, lora_rank: int = 32, seed: int | None = None
    ) -> TrainingClient:
        self.created.append(("fresh", base_model))
        inner = await self.inner.create_training_client(base_model=base_model, lora_rank=lora_rank, seed=seed)
        return RecordingTrainingClient(inner, self)

    async def create_training_client_from_state(self, path: str, *, with_optimizer: bool = True) -> TrainingClient:
        self.created.append(("from_state", (path, with_optimizer)))
        inner = await self.inner.create_training_client_from_state(path, with_optimizer=with_optimizer)
        return RecordingTrainingClient(inner, self)

    async def create_sampling_client(self, *, base_model: str, model_path: str | None = None) -> SamplingClient:
        return await self.inner.create_sampling_client(base_model=base_model, model_path=model_path)


# --------------------------------------------------------------------------- helpers


def make_backend(server: SkyRLServer, timeouts: TinkerTimeouts = TIMEOUTS) -> RecordingBackend:
    return RecordingBackend(TinkerBackend(base_url=server.base_url, api_key=DUMMY_API_KEY, timeouts=timeouts))


async def server_tokenizer(server: SkyRLServer) -> Tokenizer:
    """The model's tokenizer, as the SDK loads it for a training client (cached per run)."""
    if server.base_url not in _tokenizer_cache:
        async with TinkerBackend(base_url=server.base_url, api_key=DUMMY_API_KEY, timeouts=TIMEOUTS) as backend:
            client = await backend.create_training_client(base_model=server.base_model, lora_rank=LORA_RANK, seed=0)
            _tokenizer_cache[server.base_url] = await client.get_tokenizer()
    return _tokenizer_cache[server.base_url]


def make_config(server: SkyRLServer, log_path: Path, **overrides: Any) -> trio_rl.Config:
    settings: dict[str, Any] = {
        "log_path": log_path,
        "base_model": server.base_model,
        "lora_rank": LORA_RANK,
        "learning_rate": 1e-3,
        "max_tokens": MAX_TOKENS,
        "temperature": 1.0,
        "eval_every": 0,
        "save_every": 0,
        "seed": 0,
    }
    settings.update(overrides)
    return trio_rl.Config(**settings)


async def run_training(
    config: trio_rl.Config,
    dataset: ArithmeticDataset,
    backend: RecordingBackend,
    evaluators: Sequence[trio_rl.SamplingClientEvaluator] = (),
) -> trio_rl.TrainResult:
    with trio.fail_after(RUN_DEADLINE_S):
        async with backend:
            return await trio_rl.train(config, dataset=dataset, backend=backend, evaluators=evaluators)


def train_records(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The per-step training records (not the final summary or eval-only records)."""
    return [r for r in records if "progress/groups" in r]


def leaf_exceptions(error: BaseException) -> Iterator[BaseException]:
    """The non-group exceptions inside ``error``, depth first."""
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from leaf_exceptions(inner)
    else:
        yield error


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class SampleOnceEvaluator:
    """Samples the question "What is 2 + 2?" once and scores the answer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.calls = 0

    async def __call__(self, sampling_client: SamplingClient) -> dict[str, float]:
        self.calls += 1
        prompt = tinker_types.ModelInput.from_ints(self.tokenizer.encode("What is 2 + 2? Answer:"))
        params = tinker_types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=0)
        response = await sampling_client.sample(prompt, 1, params)
        text = self.tokenizer.decode(list(response.sequences[0].tokens))
        return {"eval/correct": float("4" in text)}


# --------------------------------------------------------------------------- tests


async def test_sync_run_samples_each_step_from_the_new_weights(skyrl_server: SkyRLServer, tmp_path: Path) -> None:
    tokenizer = await server_tokenizer(skyrl_server)
    num_steps = 3
    dataset = ArithmeticDataset(tokenizer, skyrl_server.eos_token_id, num_batches=num_steps)
    backend = make_backend(skyrl_server)
    evaluator = SampleOnceEvaluator(tokenizer)
    config = make_config(skyrl_server, tmp_path / "sync")

    result = await run_training(config, dataset, backend, evaluators=[evaluator])

    assert result.final_step == num_steps
    assert result.trained_groups == num_steps * GROUPS_PER_BATCH
    steps = train_records(result.metrics)
    assert [r["step"] for r in steps] == list(range(num_steps))
    for record in steps:
        # Sync on-policy: step s trains rollouts sampled from the weights of step s.
        assert record["sampling_client/step_min"] == record["sampling_client/step_max"] == record["step"]
        assert record["progress/groups"] == GROUPS_PER_BATCH
        assert "optim/skyrl.ai/grad_norm" in record

    # A new sampling client after each step: 000000 (initial) .. 000003 (final).
    assert backend.sampler_names == [f"{s:06d}" for s in range(num_steps + 1)]
    used = [name for name in backend.samples]
    rollout_samples = num_steps * GROUPS_PER_BATCH * GROUP_SIZE
    assert sorted(set(used[:rollout_samples])) == [f"{s:06d}" for s in range(num_steps)]
    for s in range(num_steps):
        assert used[:rollout_samples].count(f"{s:06d}") == GROUPS_PER_BATCH * GROUP_SIZE
    # The evaluator saw the final weights once.
    assert evaluator.calls == 1 and used[rollout_samples:] == [f"{num_steps:06d}"]

    written = read_jsonl(config.log_path / "metrics.jsonl")  # type: ignore[operator]
    assert [r["step"] for r in train_records(written)] == list(range(num_steps))
    # The final weights' accounting and their evaluation are records of their own, under the final step.
    final = {k: v for r in written if r["step"] == num_steps for k, v in r.items()}
    assert final.get("run/final_step") == num_steps and "eval/correct" in final
    checkpoint = CheckpointLog(Path(config.log_path)).last()
    assert checkpoint is not None and checkpoint.final and checkpoint.step == num_steps
    assert checkpoint.state_path.startswith("tinker://")


@pytest.mark.parametrize("staleness", ["pace", "requeue"])
async def test_async_run_trains_off_policy_within_the_staleness_bound(
    skyrl_server: SkyRLServer, tmp_path: Path, staleness: Literal["pace", "requeue"]
) -> None:
    tokenizer = await server_tokenizer(skyrl_server)
    num_batches = 4
    dataset = ArithmeticDataset(tokenizer, skyrl_server.eos_token_id, num_batches=num_batches)
    backend = make_backend(skyrl_server)
    config = make_config(
        skyrl_server,
        tmp_path / "async",
        # SkyRL trains no stable_reinforce, AsyncConfig's default.
        async_config=trio_rl.AsyncConfig(
            max_steps_off_policy=1,
            groups_per_batch=GROUPS_PER_BATCH,
            staleness=staleness,
            loss_fn="importance_sampling",
        ),
    )

    result = await run_training(config, dataset, backend)

    total_groups = num_batches * GROUPS_PER_BATCH
    assert result.trained_groups + result.dropped_groups == total_groups
    steps = train_records(result.metrics)
    assert [r["step"] for r in steps] == list(range(result.final_step))
    for record in steps:
        assert record["async/staleness_max"] <= 1
    # A new sampling client after every step.
    assert backend.sampler_names == [f"{s:06d}" for s in range(result.final_step + 1)]
    if staleness == "pace":
        # "pace" starts no group that could end up too stale: nothing is dropped,
        # and later groups wait for (and sample from) newer weights.
        assert result.dropped_groups == 0 and result.final_step == num_batches
        assert len(set(backend.samples)) >= 2
    else:
        # "requeue" may sample everything from the first weights and, once the
        # data is handed out, drop what went stale; at least K+1 steps train.
        assert result.final_step >= 2
    written = read_jsonl(Path(config.log_path) / "metrics.jsonl")
    assert [r["step"] for r in train_records(written)] == list(range(result.final_step))


async def test_resume_from_saved_state_continues_at_the_saved_step(skyrl_server: SkyRLServer, tmp_path: Path) -> None:
    tokenizer = await server_tokenizer(skyrl_server)
    log_path = tmp_path / "resume"
    num_batches = 4

    first_data = ArithmeticDataset(tokenizer, skyrl_server.eos_token_id, num_batches=num_batches)
    first_backend = make_backend(skyrl_server)
    first = await run_training(
        make_config(skyrl_server, log_path, max_steps=2, save_every=1), first_data, first_backend
    )
    assert first.final_step == 2 and first.stopped_by_max_steps
    saved = CheckpointLog(log_path).last()
    assert saved is not None and saved.step == 2
    assert first_backend.created == [("fresh", skyrl_server.base_model)]

    second_data = ArithmeticDataset(tokenizer, skyrl_server.eos_token_id, num_batches=num_batches)
    second_backend = make_backend(skyrl_server)
    second = await run_training(make_config(skyrl_server, log_path, resume=True), second_data, second_backend)

    # Restored from exactly the saved state path, optimizer included.
    assert second_backend.created == [("from_state", (saved.state_path, True))]
    assert second.final_step == num_batches
    assert [r["step"] for r in train_records(second.metrics)] == [2, 3]
    # Its first sampler is the restored step-2 weights; nothing of steps 0-1 is redone.
    assert second_backend.sampler_names[0] == "000002"
    assert sorted(second_data.finished) == [(b, g) for b in (2, 3) for g in range(GROUPS_PER_BATCH)]
    # Run counts carry across a resume: the resumed part reports the whole run's.
    assert first.trained_groups == 2 * GROUPS_PER_BATCH
    assert second.trained_groups == num_batches * GROUPS_PER_BATCH
    steps_on_disk = [r["step"] for r in train_records(read_jsonl(log_path / "metrics.jsonl"))]
    assert steps_on_disk == list(range(num_batches))


async def test_bad_token_ends_the_run_with_a_named_timeout(skyrl_server: SkyRLServer, tmp_path: Path) -> None:
    """A prompt token beyond the vocabulary: SkyRL answers 500 forever; trio_rl's deadline ends the run."""
    tokenizer = await server_tokenizer(skyrl_server)
    deadline_s = 10.0
    timeouts = TinkerTimeouts(
        create_training_client=120,
        forward_backward=deadline_s,
        optim_step=deadline_s,
        sample=deadline_s,
        checkpoint=60,
        tokenizer=60,
    )
    dataset = ArithmeticDataset(
        tokenizer, skyrl_server.eos_token_id, num_batches=2, bad_token=skyrl_server.vocab_size + 1000
    )
    backend = make_backend(skyrl_server, timeouts)
    config = make_config(skyrl_server, tmp_path / "bad")

    started = trio.current_time()
    with pytest.raises(ExceptionGroup) as caught:
        await run_training(config, dataset, backend)
    # Every rollout in flight hits its own deadline; each is reported, none is lost.
    leaves = list(leaf_exceptions(caught.value))
    timeouts_seen = [e for e in leaves if isinstance(e, RemoteTimeoutError)]
    assert timeouts_seen and len(timeouts_seen) == len(leaves), leaves
    for error in timeouts_seen:
        assert error.what in ("sample", "forward_backward", "optim_step"), error
        assert str(error) == (
            f"{error.what} did not complete within {deadline_s!r} s on the Tinker server at "
            f"{skyrl_server.base_url} (is it down or overloaded?)"
        )
    elapsed = trio.current_time() - started
    # One deadline (plus creating the client and saving the first weights), not RUN_DEADLINE_S.
    assert elapsed < deadline_s + 60, f"the run took {elapsed:.0f} s to fail"
    print(f"bad request ended the run after {elapsed:.1f} s with: {leaves!r}")


async def test_pipeline_sampling_seeds_fit_int32(skyrl_server: SkyRLServer) -> None:
    """The seeds the pipeline sends must be accepted by a self-hosted server.

    skyrl 0.3.0 answers 400 ("out of bounds for int32") to a seed >= 2**31, so
    a run whose rollout seeds were wider failed at its first sample. This sends
    the seed the pipeline gives the first rollout of a run with seed 0.
    """
    from trio_rl.base.determinism import derive_seed
    from trio_rl.rl.rollouts import SamplingPolicy

    tokenizer = await server_tokenizer(skyrl_server)
    config = make_config(skyrl_server, Path("unused"))
    seed = derive_seed(config.seed, 0, 0, 0, 0, 0)  # (seed, batch, group, attempt, env, attempt)
    with trio.fail_after(RUN_DEADLINE_S):
        async with TinkerBackend(base_url=skyrl_server.base_url, api_key=DUMMY_API_KEY, timeouts=TIMEOUTS) as backend:
            client = await backend.create_training_client(
                base_model=skyrl_server.base_model, lora_rank=LORA_RANK, seed=0
            )
            sampler = await client.save_weights_for_sampler("seed-check")
            policy = SamplingPolicy(sampler, config.sampling_params(), seed)
            prompt = tinker_types.ModelInput.from_ints(tokenizer.encode("What is 1 + 1? Answer:"))
            try:
                await policy(prompt, [skyrl_server.eos_token_id])
            except Exception as error:
                pytest.fail(
                    f"the pipeline's sampling seed {seed} (from derive_seed) was rejected: {error}; "
                    f"seeds must be < 2**31 for skyrl"
                )


async def test_step_loss_is_reported_without_a_loss_sum_metric(skyrl_server: SkyRLServer, tmp_path: Path) -> None:
    """SkyRL returns per-token losses only; the step's loss must still reach metrics.jsonl."""
    tokenizer = await server_tokenizer(skyrl_server)
    dataset = ArithmeticDataset(tokenizer, skyrl_server.eos_token_id, num_batches=1)
    # cross_entropy: its loss (minus the sampled tokens' logprobs) is never zero.
    config = make_config(skyrl_server, tmp_path / "loss", loss_fn="cross_entropy")

    result = await run_training(config, dataset, make_backend(skyrl_server))

    (record,) = train_records(result.metrics)
    assert record["train/loss:sum"] > 0.0
