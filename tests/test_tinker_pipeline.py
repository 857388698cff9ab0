"""A whole training run of the fake env through TinkerBackend on the SDK stand-in (real threads, real time)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trio

from tests.pipeline_helpers import MODES, make_config
from tests.tinker_sdk_standin import open_standin_service
from trio_rl import train
from trio_rl._tinker_compat import HAS_STABLE_REINFORCE
from trio_rl.async_loss import with_async_loss
from trio_rl.backends import TinkerBackend
from trio_rl.testing import FakeDataset, FakeEnvSpec, FakeEvaluator


@pytest.mark.parametrize(
    ("mode", "sdk_style"), [("sync", "0.24"), ("sync", "0.38"), ("pace", "0.24"), ("requeue", "0.38"), ("stream", "0.38")]
)
async def test_training_run_through_tinker_backend(tmp_path: Path, mode: str, sdk_style: str) -> None:
    assert mode in MODES
    dataset = FakeDataset(num_batches=4, batch_size=4, spec=FakeEnvSpec(group_size=2, turns=2))
    evaluator = FakeEvaluator()
    config = make_config(tmp_path / "run", mode, eval_every=2, save_every=2, max_tokens=4)
    if config.async_config is not None and (sdk_style == "0.24" or not HAS_STABLE_REINFORCE):
        # tinker 0.24.1 has no stable_reinforce, AsyncConfig's default: such a run chooses its loss
        # (the stand-in's style, or the SDK installed: the SkyRL suite runs this file on 0.24.1).
        config = dataclasses.replace(
            config, async_config=dataclasses.replace(config.async_config, loss_fn="importance_sampling")
        )
    with open_standin_service(sdk_style=sdk_style, latency_s=0.001, jitter_s=0.002) as service:
        with trio.fail_after(60):
            async with TinkerBackend(service_client=service) as backend:
                result = await train(config, dataset=dataset, backend=backend, evaluators=(evaluator,))
        assert service.loop_errors == []
        (client,) = service.training_clients
        assert client.step == result.final_step > 0
        submits = [op for what, _, op, _ in service.events if what == "submit" and op in ("forward_backward", "optim_step")]
        assert submits[-1] == "optim_step" and submits.count("optim_step") == result.final_step
        sampler_saves = [p for p, c in service.checkpoints.items() if c.kind == "sampler"]
        states = [p for p, c in service.checkpoints.items() if c.kind == "state"]
    # One sampling client per step, plus the initial one.
    assert len(sampler_saves) == result.final_step + 1
    assert all(path.startswith("tinker://") for path in states)
    assert result.checkpoint is not None and result.checkpoint.state_path in states
    if mode in ("sync", "stream"):
        # On-policy: every step sampled from the client made right after the step before.
        assert [r["sampling_client/step_min"] for r in result.step_metrics] == list(range(result.final_step))
    assert result.summary["run/trained_groups"] + result.summary["run/dropped_stale"] == 16
    assert (tmp_path / "run" / "metrics.jsonl").exists()
    # Every forward_backward trained the run's loss (an async run on 0.38: stable_reinforce, which the
    # stand-in refuses without provenance naming sequences sampled with stability info).
    assert set(service.trained_losses) == {with_async_loss(config, backend).training_loss_fn()}
