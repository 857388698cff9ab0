"""In-flight weights on TinkerBackend, against the SDK stand-in's model of tinker 0.38's contract.

tinker 0.38 (``types/sampling_client_kind.py``, ``TrainingClient.save_weights_and_get_sampling_client``):
an in-flight save updates one mutable weights target shared by all in-flight clients of a
training client; a sample runs on its client's weights or newer, and may finish on newer ones;
responses do not say which weights made which token. Real time with tiny latencies, as in
test_tinker_backend.py. The SkyRL suite runs this file on tinker 0.24.1, which has no ``kind``:
the tests that need it skip there, and the refusal before any work runs for real.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import io
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
import tinker
import trio
from tinker import types as tinker_types

from tests.pipeline_helpers import make_config
from tests.polling import wait_until
from tests.tinker_sdk_standin import StandinServiceClient, open_standin_service
from trio_rl import AsyncConfig, Config, ConfigError, train
from trio_rl import _tinker_compat as compat
from trio_rl.async_loss import with_async_loss
from trio_rl.backends import protocol
from trio_rl.backends.tinker import InflightWeightsRefusedError, TinkerBackend, TinkerTrainingClient
from trio_rl.testing import FakeDataset

needs_inflight = pytest.mark.skipif(
    not compat.HAS_INFLIGHT_WEIGHTS, reason="the installed tinker SDK has no in-flight weights (kind, from 0.38)"
)

BASE_MODEL = "standin/base"
ADAM = tinker_types.AdamParams(learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-8)
PROMPT = tinker_types.ModelInput.from_ints([5, 6, 7])
SAVE = "save_weights_and_get_sampling_client"


def inflight_config(log_path: Path, **async_overrides: Any) -> Config:
    async_config = AsyncConfig(
        max_steps_off_policy=1, groups_per_batch=4, staleness="oldest_first", inflight_weights=True, **async_overrides
    )
    return make_config(log_path, "oldest_first", async_config=async_config, max_tokens=4)


async def train_one_step(client: TinkerTrainingClient) -> None:
    datum = tinker_types.Datum(
        model_input=tinker_types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={"target_tokens": compat.tensor([2, 3], "int64"), "weights": compat.tensor([1, 1], "float32")},
    )
    await (await client.forward_backward([datum], "cross_entropy")).result()
    await (await client.optim_step(ADAM)).result()


def refusal(kind: str) -> Exception:
    """How a server without in-flight weights could answer the save, as the SDK raises it."""
    if kind == "request_failed":
        return tinker.RequestFailedError(
            "Request failed: unknown sampling client kind 'inflight'",
            request_id="standin-7",
            category=tinker_types.RequestErrorCategory.User,
        )
    status = 400 if kind == "bad_request" else 500
    response = httpx.Response(status, request=httpx.Request("POST", "http://standin/api/v1/save_weights_for_sampler"))
    error_type = tinker.BadRequestError if status == 400 else tinker.InternalServerError
    return error_type(f"Error code: {status} - unknown sampling client kind 'inflight'", response=response, body=None)


@needs_inflight
async def test_inflight_saves_use_kind_inflight_and_snapshots_stay_named_saves(service: StandinServiceClient) -> None:
    with trio.fail_after(20):
        async with TinkerBackend(service_client=service) as backend:
            client = await backend.create_training_client(base_model=BASE_MODEL)
            snapshot = await client.save_weights_for_sampler("000000")
            assert service.sampler_kinds == []
            inflight = await client.save_weights_for_sampler("000000", inflight=True)
    (sdk_training,) = service.training_clients
    assert snapshot.model_path == f"tinker://{sdk_training.model_id}/sampler_weights/000000"
    assert service.sampler_kinds == ["inflight"]
    # Ephemeral on the service: no name, no path.
    assert inflight.model_path is None
    assert inflight.sdk_client.inflight_of is sdk_training and snapshot.sdk_client.inflight_of is None


@needs_inflight
async def test_an_inflight_save_follows_the_optim_step_submitted_before_it(service: StandinServiceClient) -> None:
    with trio.fail_after(20):
        async with TinkerBackend(service_client=service) as backend:
            client = await backend.create_training_client(base_model=BASE_MODEL)
            datum = tinker_types.Datum(
                model_input=tinker_types.ModelInput.from_ints([1, 2]),
                loss_fn_inputs={
                    "target_tokens": compat.tensor([2, 3], "int64"),
                    "weights": compat.tensor([1, 1], "float32"),
                },
            )
            trained = await client.forward_backward([datum], "cross_entropy")
            stepped = await client.optim_step(ADAM)
            # Saved without waiting for the step: the submit order alone puts it after.
            inflight = await client.save_weights_for_sampler("000001", inflight=True)
            await trained.result()
            await stepped.result()
    submits = [op for what, _, op, _ in service.events if what == "submit"]
    assert submits == ["forward_backward", "optim_step", SAVE]
    assert inflight.sdk_client.weights_step == 1


@needs_inflight
async def test_inflight_clients_sample_the_newest_saved_weights_while_snapshots_stay_pinned(
    service: StandinServiceClient,
) -> None:
    params = tinker_types.SamplingParams(max_tokens=3, seed=0)
    with trio.fail_after(20):
        async with TinkerBackend(service_client=service) as backend:
            client = await backend.create_training_client(base_model=BASE_MODEL)
            first = await client.save_weights_for_sampler("000000", inflight=True)
            snapshot = await client.save_weights_for_sampler("000000")
            await train_one_step(client)
            await client.save_weights_for_sampler("000001", inflight=True)
            response = await first.sample(PROMPT, 1, params)
            await snapshot.sample(PROMPT, 1, params)
    # The client returned before the second save samples from it: every token on step 1.
    assert service.inflight_token_steps == [[1, 1, 1]]
    assert snapshot.sdk_client.weights_step == 0
    # The service does not say which weights made which token.
    (sequence,) = response.sequences
    assert protocol.token_versions(sequence) is None


@needs_inflight
async def test_a_running_inflight_sample_finishes_on_weights_saved_meanwhile(service: StandinServiceClient) -> None:
    params = tinker_types.SamplingParams(max_tokens=4, seed=0)
    with trio.fail_after(20):
        async with TinkerBackend(service_client=service) as backend:
            client = await backend.create_training_client(base_model=BASE_MODEL)
            sampler = await client.save_weights_for_sampler("000000", inflight=True)
            service.hold("sample_token")  # between tokens
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sampler.sample, PROMPT, 1, params)
                await wait_until(lambda: bool(service.inflight_token_steps and service.inflight_token_steps[0]))
                await train_one_step(client)
                await client.save_weights_for_sampler("000001", inflight=True)
                service.release("sample_token")
    # Started on step 0, adopted step 1 from the next token on.
    assert service.inflight_token_steps == [[0, 1, 1, 1]]


def test_the_inflight_flag_follows_the_installed_sdk() -> None:
    major, minor = (int(part) for part in importlib.metadata.version("tinker").split(".")[:2])
    has_kind = (major, minor) >= (0, 38)
    assert has_kind == compat.HAS_INFLIGHT_WEIGHTS


@needs_inflight
def test_the_inflight_save_call_fits_the_installed_sdk() -> None:
    # The stand-in models the signature; this holds it to the SDK's own.
    signature = inspect.signature(tinker.TrainingClient.save_weights_and_get_sampling_client)
    signature.bind(object(), kind="inflight", record_stability_info=True)
    assert "inflight" in get_args(tinker_types.SamplingClientKind)


@needs_inflight
def test_check_inflight_weights_accepts_an_sdk_with_kind() -> None:
    backend = TinkerBackend(api_key="tml-unused")
    backend.check_inflight_weights()
    protocol.check_inflight_before_work(backend)


def test_check_inflight_weights_refuses_an_sdk_without_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "HAS_INFLIGHT_WEIGHTS", False)
    monkeypatch.setattr(compat, "SDK_VERSION", "tinker 0.24.1")
    with pytest.raises(ValueError, match=r"with tinker 0\.24\.1: they need tinker 0\.38 or later"):
        TinkerBackend(api_key="tml-unused").check_inflight_weights()


async def test_an_inflight_save_on_an_sdk_without_kind_sends_nothing(
    service: StandinServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compat, "HAS_INFLIGHT_WEIGHTS", False)
    with trio.fail_after(20):
        async with TinkerBackend(service_client=service) as backend:
            client = await backend.create_training_client(base_model=BASE_MODEL)
            with pytest.raises(ValueError, match=r"they need tinker 0\.38"):
                await client.save_weights_for_sampler("000000", inflight=True)
    assert [op for _, _, op, _ in service.events if op == SAVE] == []


async def test_an_inflight_run_on_an_sdk_without_kind_fails_before_any_work(
    tmp_path: Path, service: StandinServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On tinker 0.24.1 (the SkyRL suite) for real; on 0.38 with the SDK's feature flag turned off.
    if compat.HAS_INFLIGHT_WEIGHTS:
        monkeypatch.setattr(compat, "HAS_INFLIGHT_WEIGHTS", False)
    config = inflight_config(tmp_path / "run", loss_fn="importance_sampling")
    with trio.fail_after(20):
        async with TinkerBackend(service_client=service) as backend:
            with pytest.raises(ConfigError, match=r"they need tinker 0\.38 or later") as info:
                await train(config, dataset=FakeDataset(1, 4), backend=backend)
    assert info.value.field == "async_config.inflight_weights"
    assert compat.SDK_VERSION in str(info.value)
    assert service.training_clients == [] and not (tmp_path / "run").exists()


@needs_inflight
async def test_a_run_with_inflight_weights_trains_every_group_once(tmp_path: Path) -> None:
    config = inflight_config(tmp_path / "run")
    with open_standin_service(latency_s=0.001, jitter_s=0.002) as service:
        with trio.fail_after(60):
            async with TinkerBackend(service_client=service) as backend:
                result = await train(config, dataset=FakeDataset(num_batches=4, batch_size=4), backend=backend)
        assert service.loop_errors == []
        (client,) = service.training_clients
        heads = [head for call in service.trained_prompt_heads for head in call]
    assert len(heads) == len(set(heads)) == result.trained_groups == 16
    assert result.dropped_groups == 0 and client.step == result.final_step > 0
    # Every publish (the first one too) was an in-flight save, and no snapshot was named.
    assert service.sampler_kinds == ["inflight"] * (result.final_step + 1)
    assert not [path for path, checkpoint in service.checkpoints.items() if checkpoint.kind == "sampler"]
    # Rollouts ran on in-flight clients, each token on weights no older than the one before.
    assert service.inflight_token_steps
    assert all(steps == sorted(steps) for steps in service.inflight_token_steps)
    # An async run on 0.38 trains stable_reinforce: its in-flight samplers recorded stability info.
    assert set(service.trained_losses) == {with_async_loss(config, backend).training_loss_fn()} == {"stable_reinforce"}


@needs_inflight
@pytest.mark.parametrize("kind", ["request_failed", "bad_request"])
async def test_a_server_refusing_inflight_weights_fails_the_run_before_any_rollout(tmp_path: Path, kind: str) -> None:
    from trio_rl.cli.reporting import distinct_leaves

    reply = refusal(kind)
    with open_standin_service(inflight_refusal=reply) as service:
        with trio.fail_after(20):
            async with TinkerBackend(service_client=service) as backend:
                with pytest.RaisesGroup(InflightWeightsRefusedError, flatten_subgroups=True) as info:
                    await train(inflight_config(tmp_path / "run"), dataset=FakeDataset(2, 4), backend=backend)
        assert service.samples_started == 0
    (error,) = distinct_leaves(info.value)
    assert isinstance(error, InflightWeightsRefusedError) and isinstance(error, ConfigError)
    assert error.field == "async_config.inflight_weights" and error.reply is reply and error.__cause__ is reply
    message = str(error)
    assert "unknown sampling client kind 'inflight'" in message and "AsyncConfig.inflight_weights" in message


@needs_inflight
def test_the_command_line_reports_a_refused_inflight_save_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("tyro")  # the command line's; the SkyRL stage's venv has none
    from trio_rl.cli import EXIT_CONFIG_ERROR, Reporting, run_cli

    out = io.StringIO()
    with open_standin_service(inflight_refusal=refusal("request_failed")) as service:
        backend = TinkerBackend(service_client=service)
        code = run_cli(
            inflight_config(tmp_path / "run"),
            dataset=FakeDataset(2, 4),
            backend=backend,
            reporting=Reporting(progress=False, out=out),
        )
    assert code == EXIT_CONFIG_ERROR
    (line,) = out.getvalue().splitlines()
    assert line.startswith("error: async_config.inflight_weights: the Tinker server refused to save in-flight weights")
    assert "unknown sampling client kind 'inflight'" in line and "AsyncConfig.inflight_weights" in line


@needs_inflight
async def test_a_server_error_on_an_inflight_save_reaches_the_caller_unchanged() -> None:
    # A 5xx is a failing server, not a refusal of the kind.
    server_error = refusal("internal")
    with open_standin_service(inflight_refusal=server_error) as service:
        with trio.fail_after(20):
            async with TinkerBackend(service_client=service) as backend:
                client = await backend.create_training_client(base_model=BASE_MODEL)
                with pytest.raises(tinker.InternalServerError) as info:
                    await client.save_weights_for_sampler("000000", inflight=True)
    assert info.value is server_error


def test_the_standin_in_the_0_24_style_saves_no_inflight_weights() -> None:
    with open_standin_service(sdk_style="0.24") as service:
        sdk_client = service.create_lora_training_client(BASE_MODEL)
        with pytest.raises(TypeError, match="'kind'"):
            sdk_client.save_weights_and_get_sampling_client(kind="inflight")
        snapshot = sdk_client.save_weights_and_get_sampling_client()  # blocks and returns the client, as 0.24.1
        assert snapshot.inflight_of is None and service.sampler_kinds == ["snapshot"]
