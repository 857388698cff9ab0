"""trio_rl's TinkerBackend against a real SkyRL server (tinker SDK 0.24.1, JSON wire format).

* Every loss the pipeline can send round-trips: the data is built by trio_rl's
  own ``trajectory_to_data`` from a real sample, and the per-token losses the
  server returns match the loss formulas applied to the logprobs it returns.
  SkyRL sends no ``loss:sum`` metric, so losses are read from
  ``loss_fn_outputs`` (``elementwise_loss``).
* A bad request (a token id beyond the vocabulary) makes the server answer 500
  forever, which the SDK retries; TinkerBackend's deadline must turn that into
  a ``RemoteTimeoutError`` naming the call and the time waited.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np
import pytest
import trio
from skyrl_server import DUMMY_API_KEY, SkyRLServer
from tinker import types as tinker_types

from trio_rl.backends.tinker import RemoteTimeoutError, TinkerBackend, TinkerTimeouts
from trio_rl.rl.data import trajectory_to_data, without_mask
from trio_rl.types import TokensWithLogprobs, Trajectory, Transition

pytestmark = pytest.mark.integration

LORA_RANK = 8
TEST_DEADLINE_S = 240.0
"""Absolute bound on one test, whatever the per-call deadlines."""

# Generous enough for the first call of a shape (JAX compiles for ~5 s on 2
# cores), short enough that a hang fails the test in well under a minute.
TIMEOUTS = TinkerTimeouts(
    create_training_client=120,
    forward_backward=90,
    optim_step=90,
    sample=90,
    checkpoint=90,
    tokenizer=60,
)

CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
"""Explicit clip thresholds, so the expected ppo/cispo losses do not rely on server defaults."""

PIPELINE_LOSSES: list[tuple[str, dict[str, float] | None]] = [
    ("importance_sampling", None),
    ("ppo", CLIP),
    ("cispo", CLIP),
    ("cross_entropy", None),
]


def tensors(**columns: Sequence[float] | Sequence[int]) -> dict[str, tinker_types.TensorData]:
    """``loss_fn_inputs`` from plain lists: ints as int64, floats as float32."""
    out: dict[str, tinker_types.TensorData] = {}
    for name, values in columns.items():
        dtype = np.int64 if all(isinstance(v, int) for v in values) else np.float32
        out[name] = tinker_types.TensorData.from_numpy(np.asarray(values, dtype=dtype))
    return out


def backend_for(server: SkyRLServer, timeouts: TinkerTimeouts = TIMEOUTS) -> TinkerBackend:
    """A TinkerBackend pointed at the test server."""
    return TinkerBackend(base_url=server.base_url, api_key=DUMMY_API_KEY, timeouts=timeouts)


def expected_elementwise_loss(
    loss_fn: str,
    config: dict[str, float] | None,
    logprobs: np.ndarray,
    inputs: dict[str, np.ndarray],
) -> np.ndarray:
    """The per-token loss of ``loss_fn`` given the learner's ``logprobs`` (tinker's definitions)."""
    loss: np.ndarray
    if loss_fn == "cross_entropy":
        loss = -inputs["weights"] * logprobs
        return loss
    ratio = np.exp(logprobs - inputs["logprobs"])
    advantages = inputs["advantages"]
    # The pipeline sends no weights for RL losses; the server then weighs every token 1.
    weights = inputs.get("weights", np.ones_like(logprobs))
    if loss_fn == "importance_sampling":
        loss = -weights * ratio * advantages
        return loss
    assert config is not None
    clipped = np.clip(ratio, config["clip_low_threshold"], config["clip_high_threshold"])
    if loss_fn == "ppo":
        loss = -weights * np.minimum(ratio * advantages, clipped * advantages)
    elif loss_fn == "cispo":
        loss = -weights * clipped * logprobs * advantages
    else:
        raise AssertionError(f"no formula for {loss_fn}")
    return loss


async def test_each_pipeline_loss_round_trips(skyrl_server: SkyRLServer) -> None:
    with trio.fail_after(TEST_DEADLINE_S):
        async with backend_for(skyrl_server) as backend:
            client = await backend.create_training_client(
                base_model=skyrl_server.base_model, lora_rank=LORA_RANK, seed=0
            )
            tokenizer = await client.get_tokenizer()
            prompt = tinker_types.ModelInput.from_ints(tokenizer.encode("What is 3 + 4? Answer:"))
            sampler = await client.save_weights_for_sampler("loss-roundtrip")
            response = await sampler.sample(
                prompt, 2, tinker_types.SamplingParams(max_tokens=8, temperature=1.0, seed=1)
            )
            trajectories = [
                Trajectory(
                    transitions=[
                        Transition(
                            ob=prompt,
                            ac=TokensWithLogprobs(tokens=list(seq.tokens), maybe_logprobs=seq.logprobs),
                            reward=0.0,
                            episode_done=True,
                        )
                    ],
                    final_ob=prompt,
                )
                for seq in response.sequences
            ]

            for loss_fn, config in PIPELINE_LOSSES:
                # One positive and one negative advantage, as a GRPO group gives.
                data = [
                    datum
                    for trajectory, advantage in zip(trajectories, (1.0, -1.0), strict=True)
                    # Submitted as the pipeline submits it: without the action mask.
                    for datum in map(without_mask, trajectory_to_data(trajectory, advantage, loss_fn))
                ]
                pending = await client.forward_backward(data, loss_fn, config)  # type: ignore[arg-type]
                output = await pending.result()

                assert "loss:sum" not in output.metrics  # SkyRL's difference from the service
                assert len(output.loss_fn_outputs) == len(data), loss_fn
                total = 0.0
                for datum, out in zip(data, output.loss_fn_outputs, strict=True):
                    logprobs = out["logprobs"].to_numpy().astype(np.float64)
                    losses = out["elementwise_loss"].to_numpy().astype(np.float64)
                    assert logprobs.shape == losses.shape == (datum.model_input.length,), loss_fn
                    inputs = {k: v.to_numpy().astype(np.float64) for k, v in datum.loss_fn_inputs.items()}
                    expected = expected_elementwise_loss(loss_fn, config, logprobs, inputs)
                    np.testing.assert_allclose(losses, expected, rtol=1e-4, atol=1e-5, err_msg=loss_fn)
                    total += float(losses.sum())
                assert math.isfinite(total), loss_fn

                step = await client.optim_step(tinker_types.AdamParams(learning_rate=1e-3))
                metrics = (await step.result()).metrics or {}
                assert math.isfinite(metrics.get("skyrl.ai/grad_norm", math.nan)), loss_fn


async def test_unsupported_dro_loss_fails_fast(skyrl_server: SkyRLServer) -> None:
    """trio_rl's Config accepts "dro"; skyrl 0.3.0 does not implement it. It must fail, not hang."""
    with trio.fail_after(TEST_DEADLINE_S):
        async with backend_for(skyrl_server) as backend:
            client = await backend.create_training_client(
                base_model=skyrl_server.base_model, lora_rank=LORA_RANK, seed=0
            )
            datum = tinker_types.Datum(
                model_input=tinker_types.ModelInput.from_ints([5, 6, 7, 8]),
                loss_fn_inputs=tensors(target_tokens=[6, 7, 8, 9], logprobs=[-1.0] * 4, advantages=[1.0] * 4),
            )
            started = time.monotonic()
            with pytest.raises(Exception) as caught:  # any prompt error is right
                pending = await client.forward_backward([datum], "dro")
                await pending.result()
            assert not isinstance(caught.value, RemoteTimeoutError), "dro hung until the deadline"
            # skyrl answers 422 (a pydantic literal error naming loss_fn); the SDK raises it.
            assert "loss_fn" in str(caught.value), caught.value
            assert time.monotonic() - started < 30


async def test_token_beyond_vocabulary_times_out_with_a_named_error(skyrl_server: SkyRLServer) -> None:
    """SkyRL answers 500 for the NaN results and the SDK retries; the deadline ends it."""
    deadline_s = 10.0
    timeouts = TinkerTimeouts(
        create_training_client=120, forward_backward=deadline_s, optim_step=60, sample=60, checkpoint=60
    )
    with trio.fail_after(TEST_DEADLINE_S):
        async with backend_for(skyrl_server, timeouts) as backend:
            client = await backend.create_training_client(
                base_model=skyrl_server.base_model, lora_rank=LORA_RANK, seed=0
            )
            bad = skyrl_server.vocab_size + 1000
            good = tinker_types.Datum(
                model_input=tinker_types.ModelInput.from_ints([5, 6, 7, 8]),
                loss_fn_inputs=tensors(target_tokens=[6, 7, 8, 9], weights=[1.0] * 4),
            )
            datum = tinker_types.Datum(
                model_input=tinker_types.ModelInput.from_ints([5, bad, 7, 8]),
                loss_fn_inputs=tensors(target_tokens=[bad, 7, 8, bad], weights=[1.0] * 4),
            )
            # Two data, like the other tests: the engine has already compiled that
            # shape, so the deadline measures the hang, not a JAX compile.
            pending = await client.forward_backward([good, datum], "cross_entropy")
            started = time.monotonic()
            with pytest.raises(RemoteTimeoutError) as caught:
                await pending.result()
            waited = time.monotonic() - started
    error = caught.value
    assert error.what == "forward_backward"
    assert error.timeout == deadline_s
    assert str(error) == (
        f"forward_backward did not complete within 10.0 s on the Tinker server at {skyrl_server.base_url} "
        "(is it down or overloaded?)"
    )
    assert deadline_s - 1 <= waited <= deadline_s + 10
