"""How weights are published: snapshots or in flight, chosen once from the configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from trio_rl import AsyncConfig, Config
from trio_rl.backends.protocol import SamplingClient, TrainingClient
from trio_rl.loop.publishing import InflightWeights, SnapshotWeights, publishing_for


class RecordingClient:
    """A training client that records each save for sampling and its arguments."""

    def __init__(self) -> None:
        self.saves: list[tuple[str, dict[str, Any]]] = []

    async def save_weights_for_sampler(self, name: str, **kwargs: Any) -> str:
        self.saves.append((name, kwargs))
        return f"client {name}"


def _client() -> tuple[RecordingClient, TrainingClient]:
    recording = RecordingClient()
    return recording, cast(TrainingClient, recording)


async def test_snapshots_are_saved_without_an_inflight_argument_and_an_evaluation_gets_the_latest() -> None:
    recording, client = _client()
    latest = cast(SamplingClient, "latest")
    publishing = SnapshotWeights()
    published: object = await publishing.publish(client, "000001")  # the recording client returns a name
    assert published == "client 000001"
    assert await publishing.pinned(client, 1, latest) is latest
    assert recording.saves == [("000001", {})]
    assert not publishing.token_lags_are_bounds


async def test_in_flight_weights_are_saved_in_flight_and_an_evaluation_gets_a_snapshot_of_its_version() -> None:
    recording, client = _client()
    publishing = InflightWeights()
    await publishing.publish(client, "000001")
    pinned: object = await publishing.pinned(client, 3, cast(SamplingClient, "latest"))
    assert pinned == "client 000003-eval"
    assert recording.saves == [("000001", {"inflight": True}), ("000003-eval", {})]
    assert publishing.token_lags_are_bounds


def test_the_configuration_chooses_in_flight_publishing_only_where_async_config_asks() -> None:
    base = Config(log_path=Path("unused"))
    assert isinstance(publishing_for(base), SnapshotWeights)
    assert isinstance(publishing_for(Config(log_path=Path("unused"), async_config=AsyncConfig(1, 2))), SnapshotWeights)
    inflight = Config(log_path=Path("unused"), async_config=AsyncConfig(1, 2, inflight_weights=True))
    assert isinstance(publishing_for(inflight), InflightWeights)
