"""Saving and resuming: weights, Adam moments and step count come back exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tinker import types as tinker_types

from tests.local_helpers import CONFIG, TOK, local_training_client, text_datum
from trio_rl.backends.local import CharTokenizer, LocalBackend
from trio_rl.backends.local.checkpoint import check_name
from trio_rl.backends.local.training import LocalTrainingClient

ADAM = tinker_types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.01)


BATCH = [text_datum("abc"), text_datum("hgfe dcba")]


async def _step(client: LocalTrainingClient) -> None:
    await client.forward_backward(BATCH, "cross_entropy")
    await (await client.optim_step(ADAM)).result()


def _snapshot(client: LocalTrainingClient) -> dict[str, torch.Tensor]:
    out = {f"w/{k}": v.clone() for k, v in client.model.state_dict().items()}
    out.update({f"m/{k}": v.clone() for k, v in client.adam_state.exp_avg.items()})
    out.update({f"v/{k}": v.clone() for k, v in client.adam_state.exp_avg_sq.items()})
    return out


def _assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


async def test_state_round_trip_is_bit_exact(tmp_path: Path) -> None:
    async with local_training_client(tmp_path, seed=5, deadline_s=30) as (backend, original):
        await _step(original)
        await _step(original)
        path = await original.save_state("after-2")
        assert path == str(tmp_path / "checkpoints" / "after-2")
        assert json.loads((Path(path) / "model_config.json").read_text())["d_model"] == 32
        assert CharTokenizer.from_json((Path(path) / "tokenizer.json").read_text()) == TOK

        resumed = await backend.create_training_client_from_state(path)
        assert resumed.adam_state.step == 2
        _assert_identical(_snapshot(original), _snapshot(resumed))

        other = await backend.create_training_client(base_model="tiny", seed=6)
        await other.load_state(path)
        _assert_identical(_snapshot(original), _snapshot(other))

        for client in (original, resumed, other):
            await _step(client)
        _assert_identical(_snapshot(original), _snapshot(resumed))
        _assert_identical(_snapshot(original), _snapshot(other))
        assert original.adam_state.step == resumed.adam_state.step == 3


async def test_load_without_optimizer_restarts_adam(tmp_path: Path) -> None:
    async with local_training_client(tmp_path, seed=5, deadline_s=30) as (backend, client):
        await _step(client)
        path = await client.save_state("one")
        fresh = await backend.create_training_client_from_state(path, with_optimizer=False)
        assert fresh.adam_state.step == 0 and not fresh.adam_state.exp_avg
        for k, v in client.model.state_dict().items():
            assert torch.equal(v, fresh.model.state_dict()[k])
        sampler = await client.save_weights_for_sampler("sampler-one")
        assert sampler.model_path is not None
        with pytest.raises(ValueError, match="optimizer"):
            await backend.create_training_client_from_state(sampler.model_path)
        weights_only = await backend.create_training_client_from_state(sampler.model_path, with_optimizer=False)
        assert weights_only.adam_state.step == 0
        with pytest.raises(FileNotFoundError):
            await client.load_state(str(tmp_path / "nope"))
        mismatched = LocalBackend(log_dir=tmp_path / "x", model_config=CONFIG, tokenizer=CharTokenizer("xyz"))
        async with mismatched:
            other = await mismatched.create_training_client(base_model="tiny")
            with pytest.raises(ValueError, match="shape or tokenizer"):
                await other.load_state(path)


def test_names_must_be_plain() -> None:
    for bad in ("", "../x", "a/b", ".hidden", "a b"):
        with pytest.raises(ValueError):
            check_name(bad)
    check_name("step-000010.final_v2")
