"""The tinker SDK, used directly, against a real SkyRL server.

This proves the harness (venv, tiny model, launcher, fixture) before any of
trio_rl is involved: if these fail, the trio_rl tests beside them cannot pass
either. Shapes are fixed (2 data of < 32 tokens, 4 samples of 8 tokens) so the
engine compiles each kind of call once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from bounded import bounded_result
from skyrl_server import SkyRLServer

pytestmark = pytest.mark.integration

LORA_RANK = 8
RL_LOSSES = ("importance_sampling", "ppo", "cispo")


def _datum(tokens: list[int], *, advantage: float) -> Any:
    """A Datum with every input any of the losses reads (next-token targets)."""
    from tinker import types

    inputs, targets = tokens[:-1], tokens[1:]
    n = len(targets)
    return types.Datum(
        model_input=types.ModelInput.from_ints(inputs),
        loss_fn_inputs={
            "target_tokens": types.TensorData.from_numpy(np.asarray(targets, dtype=np.int64)),
            "weights": types.TensorData.from_numpy(np.ones(n, dtype=np.float32)),
            "logprobs": types.TensorData.from_numpy(np.full(n, -2.0, dtype=np.float32)),
            "advantages": types.TensorData.from_numpy(np.full(n, advantage, dtype=np.float32)),
        },
    )


@pytest.fixture(scope="module")
def training_client(service_client: Any, skyrl_server: SkyRLServer) -> Any:
    """One LoRA training client for the module (creating one takes ~5 s the first time)."""
    return service_client.create_lora_training_client(base_model=skyrl_server.base_model, rank=LORA_RANK, seed=0)


@pytest.fixture(scope="module")
def batch(training_client: Any) -> list[Any]:
    """Two arithmetic prompts, tokenized by the server model's own tokenizer."""
    tokenizer = training_client.get_tokenizer()
    texts = ["What is 3 + 4? Answer: 7", "What is 12 + 5? Answer: 17"]
    return [
        _datum(tokenizer.encode(text, add_special_tokens=False), advantage=sign)
        for text, sign in zip(texts, (1.0, -1.0), strict=True)
    ]


def _mean_logprob(output: Any) -> float:
    values = [v for out in output.loss_fn_outputs for v in out["logprobs"].tolist()]
    return float(sum(values) / len(values))


def test_server_lists_the_tiny_model(service_client: Any, skyrl_server: SkyRLServer) -> None:
    capabilities = service_client.get_server_capabilities()
    names = [m.model_name for m in capabilities.supported_models]
    assert skyrl_server.base_model in names


@pytest.mark.parametrize("loss_fn", [*RL_LOSSES, "cross_entropy"])
def test_forward_backward_each_loss(training_client: Any, batch: list[Any], loss_fn: str) -> None:
    output = bounded_result(training_client.forward_backward(batch, loss_fn), f"forward_backward({loss_fn})")
    # skyrl returns no loss:sum metric; per-datum outputs are all there is.
    assert len(output.loss_fn_outputs) == len(batch)
    for datum, out in zip(batch, output.loss_fn_outputs, strict=True):
        logprobs = out["logprobs"].tolist()
        assert len(logprobs) == datum.model_input.length
        assert all(math.isfinite(v) and v <= 0.0 for v in logprobs)
        assert "elementwise_loss" in out
    bounded_result(training_client.optim_step(_adam()), f"optim_step after {loss_fn}")


def test_ppo_with_clip_config(training_client: Any, batch: list[Any]) -> None:
    future = training_client.forward_backward(
        batch, "ppo", loss_fn_config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    )
    output = bounded_result(future, "forward_backward(ppo, clip config)")
    assert len(output.loss_fn_outputs) == len(batch)
    bounded_result(training_client.optim_step(_adam()), "optim_step")


def test_cross_entropy_steps_raise_target_logprob(training_client: Any, batch: list[Any]) -> None:
    """The server really trains: a few supervised steps make the targets likelier."""
    before = _mean_logprob(bounded_result(training_client.forward(batch, "cross_entropy"), "forward"))
    for step in range(3):
        # Submit both, then wait: the server processes one client's requests in order.
        fb = training_client.forward_backward(batch, "cross_entropy")
        opt = training_client.optim_step(_adam(learning_rate=1e-2))
        bounded_result(fb, f"forward_backward step {step}")
        metrics = bounded_result(opt, f"optim_step step {step}").metrics
        assert metrics is not None and "skyrl.ai/grad_norm" in metrics
    after = _mean_logprob(bounded_result(training_client.forward(batch, "cross_entropy"), "forward"))
    assert after > before


def test_sample_from_trained_weights(training_client: Any, batch: list[Any], skyrl_server: SkyRLServer) -> None:
    from tinker import types

    sampler = training_client.save_weights_and_get_sampling_client()
    prompt = batch[0].model_input
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=0)
    response = bounded_result(sampler.sample(prompt, num_samples=4, sampling_params=params), "sample")
    assert len(response.sequences) == 4
    for seq in response.sequences:
        assert 1 <= len(seq.tokens) <= 8
        assert all(0 <= t < skyrl_server.vocab_size for t in seq.tokens)
        assert seq.logprobs is not None and len(seq.logprobs) == len(seq.tokens)


def test_save_state_and_restore(service_client: Any, training_client: Any, batch: list[Any]) -> None:
    """A client restored from save_state computes the same logprobs and keeps training."""
    saved = bounded_result(training_client.save_state("smoke-state"), "save_state")
    reference = _mean_logprob(bounded_result(training_client.forward(batch, "cross_entropy"), "forward"))

    restored = service_client.create_training_client_from_state(saved.path)
    again = _mean_logprob(bounded_result(restored.forward(batch, "cross_entropy"), "forward (restored)"))
    assert again == pytest.approx(reference, abs=1e-5)

    bounded_result(restored.forward_backward(batch, "importance_sampling"), "forward_backward (restored)")
    bounded_result(restored.optim_step(_adam()), "optim_step (restored)")


def _adam(learning_rate: float = 1e-3) -> Any:
    from tinker import types

    # tinker-cookbook's defaults besides the learning rate.
    return types.AdamParams(learning_rate=learning_rate, beta1=0.9, beta2=0.95, eps=1e-8)
