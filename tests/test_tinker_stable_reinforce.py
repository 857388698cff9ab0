"""stable_reinforce on TinkerBackend, against the SDK stand-in's model of tinker 0.38's contract.

tinker 0.38: samplers made with ``record_stability_info=True`` record each sampled sequence
(``SampleRequest.record_stability_info``, ``TrainingClient.create_sampling_client``), and a
training request names them through each Datum's provenance (``Datum.with_provenance``,
``types/provenance_spans.py``). Real time with tiny latencies, as in test_tinker_backend.py.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from tinker import types as tinker_types

from tests.pipeline_helpers import make_config
from tests.tinker_sdk_standin import StandinError, StandinServiceClient, open_standin_service
from trio_rl import ConfigError, TokensWithLogprobs, Trajectory, Transition, train, trajectory_to_data
from trio_rl._tinker_compat import HAS_STABLE_REINFORCE
from trio_rl.backends.tinker import TinkerBackend, TinkerTrainingClient
from trio_rl.testing import FakeDataset

# Run under an SDK that has the loss (0.38); the SkyRL suite runs this file on tinker 0.24.1 too,
# whose sequences carry no id and whose Datums no provenance.
needs_stable_reinforce = pytest.mark.skipif(
    not HAS_STABLE_REINFORCE, reason="the installed tinker SDK cannot train stable_reinforce (before 0.38)"
)

BASE_MODEL = "standin/base"
PARAMS = tinker_types.SamplingParams(max_tokens=3, seed=0)
PROMPT = [5, 6, 7]


@asynccontextmanager
async def _sampled_datum(
    service: StandinServiceClient, checked_loss: str | None, loss_fn: str = "stable_reinforce"
) -> AsyncIterator[tuple[TinkerBackend, TinkerTrainingClient, tinker_types.Datum]]:
    """Within 20 s: a backend of ``service`` that checked ``checked_loss`` (None: checked none, so its
    samplers record nothing), a training client of it, and one Datum for ``loss_fn`` built as a run
    builds it, from a sample of the client's current weights."""
    with trio.fail_after(20):
        async with TinkerBackend(service_client=service) as backend:
            if checked_loss is not None:
                backend.check_loss_fn(checked_loss, None)
            client = await backend.create_training_client(base_model=BASE_MODEL)
            sampler = await client.save_weights_for_sampler("000000")
            prompt = tinker_types.ModelInput.from_ints(PROMPT)
            (sequence,) = (await sampler.sample(prompt, 1, PARAMS)).sequences
            action = TokensWithLogprobs(sequence.tokens, sequence.logprobs, sequence_id=sequence.sequence_id)
            trajectory = Trajectory([Transition(prompt, action, 1.0, True)], prompt)
            (datum,) = trajectory_to_data(trajectory, 1.0, loss_fn=loss_fn)
            yield backend, client, datum


def _without_mask(datum: tinker_types.Datum) -> tinker_types.Datum:
    from trio_rl.rl.data import without_mask

    return without_mask(datum)


@needs_stable_reinforce
async def test_stable_reinforce_makes_samplers_record_and_trains_on_their_sequences(
    service: StandinServiceClient,
) -> None:
    async with _sampled_datum(service, "stable_reinforce") as (_, client, datum):
        pending = await client.forward_backward([_without_mask(datum)], "stable_reinforce")
        await pending.result()
    assert len(service.stability_records) == 1
    assert service.trained_losses == ["stable_reinforce"]


@needs_stable_reinforce
async def test_other_losses_leave_samplers_unrecorded(service: StandinServiceClient) -> None:
    async with _sampled_datum(service, "importance_sampling", "importance_sampling") as (backend, _, _):
        pass  # sampled from, never trained
    assert backend.record_stability_info is False and service.stability_records == {}


@needs_stable_reinforce
async def test_the_standin_refuses_stable_reinforce_on_sequences_sampled_without_stability_info(
    service: StandinServiceClient,
) -> None:
    async with _sampled_datum(service, None) as (_, client, datum):  # no check_loss_fn: no recording
        assert datum.loss_fn_input_spans is not None
        pending = await client.forward_backward([_without_mask(datum)], "stable_reinforce")
        with pytest.raises(StandinError, match="has no stability info"):
            await pending.result()


@needs_stable_reinforce
async def test_the_standin_refuses_stable_reinforce_without_provenance(service: StandinServiceClient) -> None:
    async with _sampled_datum(service, "stable_reinforce", "importance_sampling") as (_, client, datum):
        # The Datum was built without provenance.
        future = client.sdk_client.forward_backward([_without_mask(datum)], "stable_reinforce")
        with pytest.raises(StandinError, match="has no provenance"):
            future.result(timeout=5)


@needs_stable_reinforce
async def test_tinker_backend_refuses_a_datum_without_provenance_before_sending_it(
    service: StandinServiceClient,
) -> None:
    async with _sampled_datum(service, None, "importance_sampling") as (_, client, datum):
        with pytest.raises(ValueError, match="needs provenance on every datum, and datum 0 has none"):
            await client.forward_backward([datum], "stable_reinforce")
    assert not [event for event in service.events if event[2] == "forward_backward"]


def test_the_standin_in_the_0_24_style_has_no_record_stability_info_parameter() -> None:
    with open_standin_service(sdk_style="0.24") as service, pytest.raises(TypeError, match="record_stability_info"):
        service.create_sampling_client(base_model=BASE_MODEL, record_stability_info=True)


def test_tinker_backend_refuses_stable_reinforce_on_an_sdk_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from trio_rl import _tinker_compat

    monkeypatch.setattr(_tinker_compat, "HAS_STABLE_REINFORCE", False)
    monkeypatch.setattr(_tinker_compat, "SDK_VERSION", "tinker 0.24.1")
    backend = TinkerBackend(api_key="tml-unused")
    with pytest.raises(ValueError, match=re.escape("with tinker 0.24.1: it needs tinker 0.38 or later")):
        backend.check_loss_fn("stable_reinforce", None)
    backend.check_loss_fn("importance_sampling", None)
    assert backend.record_stability_info is False


async def test_an_async_run_on_an_sdk_without_stable_reinforce_fails_before_any_work(
    tmp_path: Path, service: StandinServiceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trio_rl import _tinker_compat

    monkeypatch.setattr(_tinker_compat, "HAS_STABLE_REINFORCE", False)
    config = make_config(tmp_path / "run", "pace")
    with trio.fail_after(20):
        async with TinkerBackend(service_client=service) as backend:
            # The backend refuses it; on a real SDK before 0.38 the configuration check does first.
            with pytest.raises(ConfigError, match=r"stable_reinforce'.* needs (the )?tinker (SDK )?0\.38") as info:
                await train(config, dataset=FakeDataset(1, 4), backend=backend)
    assert info.value.field == "async_config.loss_fn"
    assert service.training_clients == [] and not (tmp_path / "run").exists()
