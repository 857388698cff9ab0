"""The asyncio bridge: asyncio envs and evaluators inside a Trio run, and back.

The asyncio code lives in tests/asyncio_envs.py, a module that imports asyncio
and not trio, as cookbook modules do; "auto" therefore bridges it.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests import asyncio_envs
from tests.asyncio_envs import AsyncioDataset, AsyncioEvaluator, FailingEnv, OverflowingEnv
from tests.conftest import read_jsonl
from tests.pipeline_helpers import RUN_DEADLINE_S, make_config
from trio_rl import AsyncConfig, ConfigError, DualSamplingClient, RolloutError, StepResult, TrainResult, runs_on, train
from trio_rl.asyncio_bridge import UserCodeRunner, call_user, flavour_of, open_user_code_runner
from trio_rl.rl.metrics import WALL_TIME_PREFIX
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnv

MODE_NAMES = ["sync", "stream", "pace"]


def leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The non-group exceptions inside ``group``, however deeply nested."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


async def run_asyncio(
    log_path: Path,
    mode: str,
    dataset: Any,
    *,
    backend: FakeBackend | None = None,
    evaluators: tuple[Any, ...] = (),
    **overrides: Any,
) -> TrainResult:
    backend = backend or FakeBackend(sample_latency=1.0, train_latency=0.5)
    config = make_config(log_path, mode, **overrides)
    with trio.fail_after(RUN_DEADLINE_S):
        async with backend:
            return await train(config, dataset=dataset, backend=backend, evaluators=evaluators)


# ---------------------------------------------------------------- which domain


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(source, module.__dict__)
    return module


def test_auto_reads_the_domain_off_the_defining_module() -> None:
    aio = _module("_bridge_probe_aio", "import asyncio\nasync def f(): await asyncio.sleep(0)\n")
    from_aio = _module("_bridge_probe_from", "from asyncio import gather\nasync def f(): pass\n")
    tri = _module("_bridge_probe_trio", "import trio\nasync def f(): await trio.sleep(0)\n")
    plain = _module("_bridge_probe_plain", "async def f(): return 1\n")
    assert flavour_of(aio.f) == "asyncio"
    assert flavour_of(from_aio.f) == "asyncio"
    assert flavour_of(tri.f) == "trio"
    assert flavour_of(plain.f) == "trio"
    # Bound methods and callable objects are judged by where their code lives.
    env = asyncio_envs.GatheringEnv((0, 0, 0), asyncio_envs.AsyncioLog(), 1.0, None)
    assert flavour_of(env.step) == "asyncio"
    assert flavour_of(AsyncioEvaluator()) == "asyncio"
    assert flavour_of(FakeEnv((0, 0), 0, None, 0, []).step) == "trio"  # type: ignore[arg-type]


def test_runs_on_mark_overrides_the_module() -> None:
    @runs_on("asyncio")
    class Marked(FakeEnv):
        pass

    assert flavour_of(Marked((0, 0), 0, None, 0, []).step) == "asyncio"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="runs_on"):
        runs_on("curio")  # type: ignore[arg-type]


def test_config_rejects_an_unknown_bridge_mode(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="asyncio_bridge"):
        make_config(tmp_path, "sync", asyncio_bridge="sometimes").validate()


# ---------------------------------------------------------------- training through the bridge


@pytest.mark.parametrize("mode", MODE_NAMES)
async def test_asyncio_envs_train_in_every_mode(log_path: Path, mode: str, autojump_clock: Any) -> None:
    dataset = AsyncioDataset(3, 4)
    result = await run_asyncio(log_path, mode, dataset)
    assert result.final_step == 3
    assert result.trained_groups == 12
    # Every step gathered two children that slept in asyncio, and finished.
    assert dataset.log.finished_children == 3 * 4 * 2 * 2
    # The sampler's stop reason reached step() in extra=.
    assert {e["stop_reason"] for e in dataset.log.extras if e is not None} <= {"stop", "length"}
    assert len(dataset.log.extras) == 3 * 4 * 2 and None not in dataset.log.extras
    # Logs travel on the transitions.
    assert result.step_metrics[0]["env/all/even_frac"] >= 0


async def test_always_mode_bridges_and_never_mode_fails_as_plain_trio(log_path: Path, autojump_clock: Any) -> None:
    result = await run_asyncio(log_path / "always", "sync", AsyncioDataset(1, 2), asyncio_bridge="always")
    assert result.final_step == 1
    # Without the bridge, asyncio code meets Trio and fails at once, as it would without trio_rl's help.
    # (RuntimeError: no running event loop, or TypeError: unrecognized yield message; one per worker.)
    failures: list[BaseException] = []
    try:
        await run_asyncio(log_path / "never", "sync", AsyncioDataset(1, 2), asyncio_bridge="never")
    except* (RuntimeError, TypeError) as group:
        failures.extend(leaves(group))
    assert failures


async def test_trio_envs_keep_running_natively_in_auto_and_never_modes(log_path: Path, autojump_clock: Any) -> None:
    for bridge in ("auto", "never"):
        dataset = FakeDataset(2, 4)
        result = await run_asyncio(log_path / bridge, "sync", dataset, asyncio_bridge=bridge)
        assert result.final_step == 2


async def test_an_asyncio_exception_surfaces_as_itself(log_path: Path, autojump_clock: Any) -> None:
    dataset = AsyncioDataset(2, 2, env_type=FailingEnv)
    failures: list[BaseException] = []
    try:
        await run_asyncio(log_path, "sync", dataset)
    except* KeyError as group:  # anything else would propagate and fail the test
        failures.extend(leaves(group))
    # Every env of step 0 fails at the same virtual instant; each failure is the env's own KeyError.
    assert failures and all("asyncio env (0," in str(e) for e in failures)


async def test_max_steps_cancels_asyncio_tasks_an_env_started(log_path: Path, autojump_clock: Any) -> None:
    # Batch 0's children sleep 1 s, later ones 1000 s: with K=1 batch 1 is
    # sampled alongside batch 0, and is still asleep in asyncio when
    # max_steps=1 stops the run after step 0.
    dataset = AsyncioDataset(3, 2, delays=[1.0, 1000.0, 1000.0])
    result = await run_asyncio(
        log_path, "pace", dataset, max_steps=1, async_config=AsyncConfig(1, groups_per_batch=2, staleness="pace")
    )
    assert result.stopped_by_max_steps
    cancelled_children = [c for c in dataset.log.cancelled if c.startswith("child")]
    # Batch 1: 2 groups x 2 envs x 2 gathered children, all cancelled; none of batch 0's.
    assert len(cancelled_children) == 8
    assert all(c.startswith("child (1,") for c in cancelled_children)
    # Fire-and-forget tasks (make_envs' heartbeats) are cancelled when the run's loop closes.
    assert all(task.done() for task in dataset.log.background)
    assert len([c for c in dataset.log.cancelled if c.startswith("heartbeat")]) == len(dataset.log.background)
    assert dataset.log.made == dataset.log.cleaned


async def test_cancelling_the_run_cancels_the_asyncio_tasks(log_path: Path, autojump_clock: Any) -> None:
    dataset = AsyncioDataset(2, 2, delay=10**6)
    with trio.move_on_after(100) as scope:
        await run_asyncio(log_path, "sync", dataset)
    assert scope.cancelled_caught
    assert len([c for c in dataset.log.cancelled if c.startswith("child")]) == 2 * 2 * 2
    assert all(task.done() for task in dataset.log.background)
    # The cancelled groups' asyncio cleanups still ran to the end: the loop outlives them.
    assert dataset.log.made == dataset.log.cleaned >= 2


async def test_initial_observation_overflow_keeps_the_group_and_is_counted(log_path: Path, autojump_clock: Any) -> None:
    dataset = AsyncioDataset(2, 2, env_type=OverflowingEnv, group_size=3)
    result = await run_asyncio(log_path, "sync", dataset)
    assert result.final_step == 2
    first = result.step_metrics[0]
    assert first["rollouts/initial_overflow"] == 2  # one env of each of the step's 2 groups
    assert first["env/all/total_episodes"] == 6
    # The overflowed rollouts sampled nothing: 2 envs per group stepped.
    assert len(dataset.log.extras) == 2 * 2 * 2


# ---------------------------------------------------------------- the other direction: asyncio awaits Trio


async def test_asyncio_evaluator_awaits_trio_sampling_clients(log_path: Path, autojump_clock: Any) -> None:
    evaluator = AsyncioEvaluator()
    dataset = FakeDataset(2, 4)
    result = await run_asyncio(log_path, "sync", dataset, eval_every=1, evaluators=(evaluator,))
    assert [type(c) for c in evaluator.clients] == [DualSamplingClient] * 3
    evals = [r for r in result.metrics if "test/asyncio_tokens" in r]
    assert len(evals) == 3 and all(r["test/asyncio_tokens"] > 0 and r["test/lp"] == 3 for r in evals)


async def test_asyncio_timeout_cancels_the_trio_call(autojump_clock: Any) -> None:
    cancelled: list[bool] = []

    class SlowClient:
        async def sample(self, *args: Any) -> Any:
            try:
                await trio.sleep(100)
            except trio.Cancelled:
                cancelled.append(True)
                raise

    start = trio.current_time()
    async with open_user_code_runner("auto"):
        with trio.fail_after(50):
            outcome = await call_user(asyncio_envs.wait_for_sample, DualSamplingClient(SlowClient()), 5.0)  # type: ignore[arg-type]
    assert outcome == "timed out"
    assert cancelled == [True]
    assert trio.current_time() - start == pytest.approx(5.0)


async def test_dual_client_serves_trio_callers_directly() -> None:
    backend = FakeBackend()
    async with backend:
        training = await backend.create_training_client(base_model="x")
        client = DualSamplingClient(await training.save_weights_for_sampler("s"))
        from tinker import types as tinker_types

        from trio_rl import _tinker_compat as compat

        prompt = compat.model_input_from_ints([1, 2])
        response = await client.sample_async(prompt, 1, tinker_types.SamplingParams(max_tokens=3, seed=0))
        assert response.sequences[0].tokens
        assert len(await client.compute_logprobs(prompt)) == 2
        assert client.version == 0  # other attributes are the wrapped client's


# ---------------------------------------------------------------- time and determinism


async def test_asyncio_sleep_follows_trios_virtual_clock(autojump_clock: Any) -> None:
    async with open_user_code_runner("auto"):
        start = trio.current_time()
        loop_time = await call_user(asyncio_envs.asyncio_sleep_then_time, 3600.0)
    assert trio.current_time() - start == pytest.approx(3600.0)
    assert loop_time == pytest.approx(trio.current_time())


def _run_seeded(log_path: Path, mode: str, seed: int) -> list[dict[str, Any]]:
    async def main() -> None:
        await run_asyncio(
            log_path, mode, AsyncioDataset(3, 4, delay=0.5), backend=FakeBackend(seed=seed, sample_latency=1.0), seed=seed
        )

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    records = read_jsonl(log_path / "metrics.jsonl")
    return [{k: v for k, v in r.items() if not k.startswith(WALL_TIME_PREFIX)} for r in records]


@pytest.mark.parametrize("mode", [*MODE_NAMES, "requeue"])
def test_two_seeded_runs_of_asyncio_envs_are_identical(tmp_path: Path, mode: str) -> None:
    first = _run_seeded(tmp_path / "a", mode, seed=3)
    second = _run_seeded(tmp_path / "b", mode, seed=3)
    assert first == second
    assert len(first) == 4


# ---------------------------------------------------------------- the runner itself


async def test_never_runner_opens_no_loop_and_calls_directly() -> None:
    async def plain() -> int:
        return 7

    async with open_user_code_runner("never") as runner:
        assert await call_user(plain) == 7
        assert runner.bridged_calls == 0
    with pytest.raises(ValueError, match="asyncio_bridge"):
        async with open_user_code_runner("sometimes"):  # type: ignore[arg-type]
            pass


async def test_a_bridged_call_after_the_run_ended_is_refused() -> None:
    async with open_user_code_runner("always") as runner:
        assert await runner.call(asyncio_envs.asyncio_sleep_then_time, 0.0) >= 0
    assert isinstance(runner, UserCodeRunner)
    assert runner.bridged_calls == 1
    with pytest.raises(RuntimeError, match="closed"):
        await runner.call(asyncio_envs.asyncio_sleep_then_time, 0.0)


async def test_an_error_in_the_body_comes_out_unwrapped() -> None:
    with pytest.raises(KeyError, match="body"):
        async with open_user_code_runner("auto"):
            await call_user(asyncio_envs.asyncio_sleep_then_time, 0.0)
            raise KeyError("body")


# ---------------------------------------------------------------- the cookbook's type surface


def test_cookbook_type_signatures() -> None:
    error = RolloutError(error_type="BadRequestError", error_message="too long")
    assert (error.env_index, error.attempt, error.error) == (-1, 0, None)
    rich = RolloutError.from_exception(ValueError("x"), env_index=2, attempt=1)
    assert (rich.error_type, rich.error_message, rich.env_index, rich.attempt) == ("ValueError", "x", 2, 1)
    from trio_rl import _tinker_compat as compat

    step = StepResult(0.0, True, compat.model_input_from_ints([]), [], logs={"guess": "12"})
    assert step.logs == {"guess": "12"} and step.metrics == {}


def _imports_outside_cookbook(roots: tuple[str, ...], allowed: tuple[str, ...]) -> list[str]:
    import ast

    import trio_rl

    package = Path(trio_rl.__file__).parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative.parts[0] == "cookbook" or relative.name in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] in roots for n in names):
                offenders.append(f"{relative}:{node.lineno}")
    return offenders


def test_only_the_bridge_module_and_the_cookbook_package_import_asyncio() -> None:
    assert _imports_outside_cookbook(("asyncio", "trio_asyncio"), allowed=("asyncio_bridge.py",)) == []


def test_only_the_cookbook_package_imports_tinker_cookbook() -> None:
    assert _imports_outside_cookbook(("tinker_cookbook",), allowed=()) == []
    # types.py makes RLDatasetBuilder a chz class when chz happens to be installed (guarded import).
    assert _imports_outside_cookbook(("chz",), allowed=("types.py",)) == []
