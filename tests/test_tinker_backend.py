"""Tests for trio_rl.backends.tinker.TinkerBackend, on the SDK stand-in.

The stand-in (tests/tinker_sdk_standin.py) has the real SDK's threading model, so these
tests use real time: tiny latencies, and ``trio.fail_after`` around everything.
Most run against both SDK styles: 0.38 (creation returns futures) and 0.24.1
(creation blocks and returns the client).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import trio
from tinker import types as tinker_types

from tests.polling import wait_until
from tests.tinker_sdk_standin import StandinError, StandinServiceClient, open_standin_service
from trio_rl.backends import protocol
from trio_rl.backends.tinker import (
    MissingApiKeyError,
    RemoteTimeoutError,
    TinkerBackend,
    TinkerSamplingClient,
    TinkerTimeouts,
    TinkerTrainingClient,
)

BASE_MODEL = "standin/base"
ADAM = tinker_types.AdamParams(learning_rate=1e-4, beta1=0.9, beta2=0.95, eps=1e-8)
PARAMS = tinker_types.SamplingParams(max_tokens=4, seed=0)


@pytest.fixture(params=["0.38", "0.24"])
def service(request: pytest.FixtureRequest) -> Iterator[StandinServiceClient]:
    with open_standin_service(sdk_style=request.param) as service:
        yield service


def datum(n: int = 3) -> tinker_types.Datum:
    return tinker_types.Datum(
        model_input=tinker_types.ModelInput.from_ints(list(range(n))),
        loss_fn_inputs={
            "target_tokens": tinker_types.TensorData.from_numpy(np.arange(1, n + 1)),
            "logprobs": tinker_types.TensorData.from_numpy(np.full(n, -1.0, dtype=np.float32)),
            "advantages": tinker_types.TensorData.from_numpy(np.ones(n, dtype=np.float32)),
        },
    )


def prompt(*tokens: int) -> tinker_types.ModelInput:
    return tinker_types.ModelInput.from_ints(list(tokens) or [1, 2, 3])


async def new_client(backend: TinkerBackend) -> TinkerTrainingClient:
    return await backend.create_training_client(base_model=BASE_MODEL, lora_rank=8, seed=1)


async def test_speaks_the_backend_protocol(service: StandinServiceClient) -> None:
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service) as backend:
            client = await new_client(backend)
            sampler = await client.save_weights_for_sampler("s0")
    _backend: protocol.Backend = backend
    _client: protocol.TrainingClient = client
    _sampler: protocol.SamplingClient = sampler


async def test_training_round_trip(service: StandinServiceClient) -> None:
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service) as backend:
            client = await new_client(backend)
            sdk_client = service.training_clients[0]
            assert (sdk_client.base_model, sdk_client.rank, sdk_client.seed) == (BASE_MODEL, 8, 1)

            fb = await client.forward_backward([datum(3), datum(5)], "importance_sampling")
            optim = await client.optim_step(ADAM)
            output = await fb.result()
            assert [len(o["logprobs"].tolist()) for o in output.loss_fn_outputs] == [3, 5]
            assert "loss:sum" in output.metrics
            await optim.result()
            assert sdk_client.step == 1

            sampler = await client.save_weights_for_sampler("step-1")
            assert isinstance(sampler, TinkerSamplingClient)
            assert sampler.model_path == f"tinker://{sdk_client.model_id}/sampler_weights/step-1"
            assert sampler.sdk_client.weights_step == 1
            response = await sampler.sample(prompt(), 3, PARAMS)
            assert [len(s.tokens) for s in response.sequences] == [4, 4, 4]
            again = await sampler.sample(prompt(), 3, PARAMS)  # same seed, same samples
            assert [s.tokens for s in again.sequences] == [s.tokens for s in response.sequences]
            unseeded = tinker_types.SamplingParams(max_tokens=16)
            a, b = [(await sampler.sample(prompt(), 1, unseeded)).sequences[0].tokens for _ in "ab"]
            assert a != b
            assert await sampler.compute_logprobs(prompt(1, 2, 3)) == [None, -1.0, -1.0]

            # Later steps don't change what an existing sampler samples from.
            await (await client.forward_backward([datum()], "importance_sampling")).result()
            await (await client.optim_step(ADAM)).result()
            assert sampler.sdk_client.weights_step == 1

            path = await client.save_state("ckpt")
            assert path == f"tinker://{sdk_client.model_id}/weights/ckpt"
            assert service.checkpoints[path].step == 2

            resumed = await backend.create_training_client_from_state(path)
            assert resumed.sdk_client.loaded == [(path, True)]
            assert resumed.sdk_client.step == 2
            weights_only = await backend.create_training_client_from_state(path, with_optimizer=False)
            assert weights_only.sdk_client.loaded == [(path, False)]

            await weights_only.load_state(path, with_optimizer=True)
            await weights_only.load_state(path, with_optimizer=False)
            assert weights_only.sdk_client.loaded[1:] == [(path, True), (path, False)]
    assert service.loop_errors == []


async def test_tokenizer_comes_from_the_training_client_without_special_tokens(
    service: StandinServiceClient,
) -> None:
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service) as backend:
            client = await new_client(backend)
            tokenizer = await client.get_tokenizer()
            assert await client.get_tokenizer() is tokenizer  # loaded once
    assert isinstance(tokenizer, protocol.Tokenizer)
    assert tokenizer.encode("hi") == [104, 105]  # the SDK's own would prepend BOS (1)
    assert tokenizer.encode("hi", add_special_tokens=True) == [1, 104, 105]  # type: ignore[call-arg]
    assert tokenizer.decode([104, 105]) == "hi"
    assert tokenizer.bos_token_id == 1  # type: ignore[attr-defined]
    assert [call for call, _ in service.blocking_calls].count("get_tokenizer") == 1


async def test_submits_in_call_order_before_any_wait(service: StandinServiceClient) -> None:
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service) as backend:
            client = await new_client(backend)
            model_id = service.training_clients[0].model_id
            for _ in range(5):
                # Pipeline style: submit both, then wait (here the later one first).
                fb = await client.forward_backward([datum()], "importance_sampling")
                optim = await client.optim_step(ADAM)
                submitted = [e[2] for e in service.events if e[0] == "submit"]
                assert submitted[-2:] == ["forward_backward", "optim_step"]
                await optim.result()
                await fb.result()
            await client.save_state("end")
    done = [(op, rid) for what, mid, op, rid in service.events if what == "done" and mid == model_id]
    expected = [x for i in range(5) for x in (("forward_backward", 2 * i), ("optim_step", 2 * i + 1))]
    assert done == [*expected, ("save_state", 10)]


async def test_a_cancelled_caller_submits_nothing(service: StandinServiceClient) -> None:
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service) as backend:
            client = await new_client(backend)
            with trio.CancelScope() as scope:
                scope.cancel()
                await client.forward_backward([datum()], "importance_sampling")
            assert scope.cancelled_caught
            await (await client.optim_step(ADAM)).result()
    assert [e[2] for e in service.events if e[0] == "submit"] == ["optim_step"]


async def test_concurrent_callers_keep_their_call_order(service: StandinServiceClient) -> None:
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service) as backend:
            client = await new_client(backend)
            order: list[int] = []
            pending = []

            async def submit(i: int) -> None:
                pending.append(await client.forward_backward([datum(i + 1)], "importance_sampling"))
                order.append(i)

            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(submit, i)
            for p in pending:
                await p.result()
    # Whichever task ran first submitted first, and the service kept that order.
    done = [rid for what, _, op, rid in service.events if what == "done" and op == "forward_backward"]
    assert done == list(range(20))
    assert len(order) == 20


async def test_thousand_pending_samples_use_no_extra_threads() -> None:
    with open_standin_service() as service, trio.fail_after(10):
        async with TinkerBackend(service_client=service) as backend:
            client = await new_client(backend)
            sampler = await client.save_weights_for_sampler("s")
            await sampler.sample(prompt(), 1, PARAMS)  # everything started and warm
            baseline = threading.active_count()
            service.hold("sample")
            results: list[tinker_types.SampleResponse] = []

            async def one(i: int) -> None:
                results.append(await sampler.sample(prompt(i % 7 + 1), 1, PARAMS))

            async with trio.open_nursery() as nursery:
                for i in range(1000):
                    nursery.start_soon(one, i)
                await wait_until(lambda: service.pending("sample") == 1000)
                assert threading.active_count() <= baseline + 1
                service.release("sample")
            assert len(results) == 1000
            assert threading.active_count() <= baseline + 1


async def test_cancelled_sample_cancels_the_sdk_request(service: StandinServiceClient) -> None:
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service) as backend:
            client = await new_client(backend)
            sampler = await client.save_weights_for_sampler("s")
            service.hold("sample")
            with trio.move_on_after(0.05) as scope:
                await sampler.sample(prompt(), 1, PARAMS)
            assert scope.cancelled_caught
            await wait_until(lambda: service.cancelled["sample"] == 1)
            assert service.pending("sample") == 0
            service.release("sample")
            # The sampler is still usable afterwards.
            assert len((await sampler.sample(prompt(), 2, PARAMS)).sequences) == 2
    assert service.loop_errors == []


async def test_a_cancelled_wait_on_a_training_request_leaves_it_running(service: StandinServiceClient) -> None:
    # A submitted training request is not taken back: the state saved after a
    # cancel must include it, so the wait can be resumed.
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service) as backend:
            client = await new_client(backend)
            service.hold("forward_backward")
            pending = await client.forward_backward([datum()], "importance_sampling")
            with trio.move_on_after(0.05) as scope:
                await pending.result()
            assert scope.cancelled_caught
            assert service.cancelled["forward_backward"] == 0
            service.release("forward_backward")
            output = await pending.result()
            assert len(output.loss_fn_outputs) == 1
    assert service.loop_errors == []


async def test_sdk_exceptions_reach_the_caller_unchanged(service: StandinServiceClient) -> None:
    fb_error = StandinError("bad batch")
    sample_error = StandinError("sampler down")
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service) as backend:
            client = await new_client(backend)
            service.fail_next("forward_backward", fb_error)
            pending = await client.forward_backward([datum()], "importance_sampling")
            with pytest.raises(StandinError) as excinfo:
                await pending.result()
            assert excinfo.value is fb_error

            sampler = await client.save_weights_for_sampler("s")
            service.fail_next("sample", sample_error)
            with pytest.raises(StandinError) as excinfo:
                await sampler.sample(prompt(), 1, PARAMS)
            assert excinfo.value is sample_error

            # A request the service rejects, and a submit-time error from the SDK.
            bad = await client.forward_backward([datum()], "cross_entropy")  # lacks "weights"
            with pytest.raises(StandinError, match="weights"):
                await bad.result()
            with pytest.raises(ValueError, match="No data provided"):
                await client.forward_backward([], "importance_sampling")
            with pytest.raises(StandinError, match="no state checkpoint"):
                await backend.create_training_client_from_state("tinker://nowhere")


async def test_blocking_calls_run_off_the_trio_thread(service: StandinServiceClient) -> None:
    service.config.blocking_create_s = 0.5
    service.config.blocking_tokenizer_s = 0.2
    ticks = 0

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            await trio.sleep(0.01)
            ticks += 1

    with trio.fail_after(5):
        async with TinkerBackend(service_client=service) as backend, trio.open_nursery() as nursery:
            nursery.start_soon(heartbeat)
            start = time.monotonic()
            client = await new_client(backend)
            elapsed = time.monotonic() - start
            assert elapsed >= 0.5
            assert ticks >= 20  # ~50 if the Trio thread stayed free
            ticks = 0
            await client.get_tokenizer()
            assert ticks >= 8
            nursery.cancel_scope.cancel()
    trio_thread = threading.current_thread().name
    assert service.blocking_calls
    assert all(thread != trio_thread for _, thread in service.blocking_calls)


async def test_deadline_error_names_the_call(service: StandinServiceClient) -> None:
    timeouts = TinkerTimeouts(forward_backward=0.05, sample=0.05)
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service, timeouts=timeouts) as backend:
            client = await new_client(backend)
            service.hold("forward_backward")  # as the SDK retrying a server 500 forever
            pending = await client.forward_backward([datum()], "importance_sampling")
            with pytest.raises(RemoteTimeoutError, match=r"^forward_backward did not complete within 0\.05 s$"):
                await pending.result()
            await wait_until(lambda: service.cancelled["forward_backward"] == 1)
            service.release("forward_backward")

            sampler = await client.save_weights_for_sampler("s")
            service.hold("sample")
            with pytest.raises(RemoteTimeoutError, match=r"^sample did not complete"):
                await sampler.sample(prompt(), 1, PARAMS)
            service.release("sample")


async def test_deadline_covers_blocking_creation(service: StandinServiceClient) -> None:
    service.config.blocking_create_s = 0.5
    timeouts = TinkerTimeouts(create_training_client=0.05)
    start = time.monotonic()
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service, timeouts=timeouts) as backend:
            with pytest.raises(RemoteTimeoutError, match=r"^create_lora_training_client did not"):
                await new_client(backend)
    assert time.monotonic() - start < 0.4  # the blocked thread was abandoned


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("TINKER_API_KEY", "TINKER_CREDENTIAL_CMD", "TINKER_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no stored `tinker auth login` key


@pytest.mark.usefixtures("no_credentials")
async def test_missing_api_key_is_a_one_line_error_at_start() -> None:
    backend = TinkerBackend()
    with pytest.raises(MissingApiKeyError) as excinfo:
        async with backend:
            raise AssertionError("not reached")
    message = str(excinfo.value)
    assert "\n" not in message
    assert "TINKER_API_KEY" in message
    with pytest.raises(RuntimeError, match="enter the TinkerBackend"):
        await backend.create_training_client(base_model=BASE_MODEL)


@pytest.mark.usefixtures("no_credentials")
async def test_malformed_api_key_is_rejected_at_start() -> None:
    with pytest.raises(MissingApiKeyError, match="must start with 'tml-'"):
        async with TinkerBackend(api_key="sk-not-a-tinker-key"):
            pass


@pytest.mark.usefixtures("no_credentials")
async def test_own_service_client_is_built_and_closed_without_network(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    with trio.fail_after(5):
        async with TinkerBackend(base_url="http://127.0.0.1:9") as backend:
            import tinker

            assert isinstance(backend.service_client, tinker.ServiceClient)


@pytest.mark.usefixtures("no_credentials")
async def test_a_deadline_missed_on_an_unreachable_server_names_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing listens on port 9: the real SDK retries the refused connection
    # without end, and the deadline's error says which server did not answer.
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    timeouts = TinkerTimeouts(create_training_client=0.5, close=0.5)
    with trio.fail_after(10):
        async with TinkerBackend(base_url="http://127.0.0.1:9", api_key="tml-test-key", timeouts=timeouts) as backend:
            with pytest.raises(RemoteTimeoutError) as caught:
                await backend.create_training_client(base_model="Qwen/Qwen3-8B")
    assert str(caught.value) == (
        "create_lora_training_client did not complete within 0.5 s on the Tinker server at http://127.0.0.1:9 "
        "(is it down or overloaded?)"
    )
    assert caught.value.server == "http://127.0.0.1:9"


async def test_constructor_validation() -> None:
    with open_standin_service() as service, pytest.raises(ValueError, match="not both"):
        TinkerBackend(service_client=service, api_key="tml-x")
    with pytest.raises(ValueError, match="optim_step must be a positive number"):
        TinkerTimeouts(optim_step=0)


async def test_a_sampling_client_for_the_base_model_is_the_kl_reference(service: StandinServiceClient) -> None:
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service) as backend:
            reference = await backend.create_sampling_client(base_model=BASE_MODEL)
            assert isinstance(reference, TinkerSamplingClient) and reference.model_path is None
            assert (reference.sdk_client.base_model, reference.sdk_client.weights_step) == (BASE_MODEL, 0)
            assert await reference.compute_logprobs(prompt(1, 2, 3)) == [None, -1.0, -1.0]
            client = await new_client(backend)
            await (await client.forward_backward([datum()], "importance_sampling")).result()
            await (await client.optim_step(ADAM)).result()
            saved = await client.save_weights_for_sampler("after-one-step")
            loaded = await backend.create_sampling_client(base_model=BASE_MODEL, model_path=saved.model_path)
            assert loaded.model_path == saved.model_path and loaded.sdk_client.weights_step == 1
    assert service.loop_errors == []


async def test_an_image_datum_reaches_the_service_whole(service: StandinServiceClient) -> None:
    # tinker-cookbook 0.6.1 trains image observations on Tinker; TinkerBackend passes their chunks on.
    from trio_rl import TokensWithLogprobs, Trajectory, Transition, trajectory_to_data

    image = tinker_types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=4)
    ob = tinker_types.ModelInput(chunks=[tinker_types.EncodedTextChunk(tokens=[1, 2]), image])
    trajectory = Trajectory([Transition(ob, TokensWithLogprobs([3, 4], [-0.5, -0.25]), 1.0, True)], ob)
    data = trajectory_to_data(trajectory, 1.0)
    with trio.fail_after(5):
        async with TinkerBackend(service_client=service) as backend:
            client = await new_client(backend)
            await (await client.forward_backward(data, "importance_sampling")).result()
    assert service.trained_chunk_types == [[["encoded_text", "image", "encoded_text"]]]
