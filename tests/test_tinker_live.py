"""TinkerBackend against the real Tinker service. Skipped unless TINKER_API_KEY is set.

It creates a small LoRA training client (billed to that key), takes one training
step, samples from the saved weights, and saves the state. Choose the model with
TRIO_RL_LIVE_BASE_MODEL.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import trio
from tinker import types as tinker_types

from trio_rl.backends.tinker import TinkerBackend, TinkerTimeouts

pytestmark = pytest.mark.skipif(
    not os.environ.get("TINKER_API_KEY"), reason="needs TINKER_API_KEY (talks to the Tinker service)"
)

BASE_MODEL = os.environ.get("TRIO_RL_LIVE_BASE_MODEL", "meta-llama/Llama-3.2-1B")


async def test_one_step_sample_and_save_on_the_service() -> None:
    timeouts = TinkerTimeouts(
        create_training_client=600, forward_backward=300, optim_step=300, sample=300, checkpoint=300
    )
    with trio.fail_after(1500):
        async with TinkerBackend(timeouts=timeouts) as backend:
            client = await backend.create_training_client(base_model=BASE_MODEL, lora_rank=8, seed=0)
            tokenizer = await client.get_tokenizer()
            tokens = tokenizer.encode("The capital of France is Paris.")
            assert tokens and tokenizer.decode(tokens).strip().startswith("The capital")

            datum = tinker_types.Datum(
                model_input=tinker_types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": tinker_types.TensorData.from_numpy(
                        np.asarray(tokens[1:], dtype=np.int64)
                    ),
                    "weights": tinker_types.TensorData.from_numpy(
                        np.ones(len(tokens) - 1, dtype=np.float32)
                    ),
                },
            )
            fb = await client.forward_backward([datum], "cross_entropy")
            optim = await client.optim_step(tinker_types.AdamParams(learning_rate=1e-4))
            output = await fb.result()
            await optim.result()
            assert len(output.loss_fn_outputs) == 1
            assert "loss:sum" in output.metrics

            name = f"trio-rl-live-{int(time.time())}"
            sampler = await client.save_weights_for_sampler(name)
            assert sampler.model_path is not None and sampler.model_path.startswith("tinker://")
            prompt = tinker_types.ModelInput.from_ints(tokenizer.encode("The capital of France is"))
            response = await sampler.sample(
                prompt, 2, tinker_types.SamplingParams(max_tokens=8, temperature=1.0)
            )
            assert len(response.sequences) == 2
            assert all(len(s.logprobs or []) == len(s.tokens) for s in response.sequences)

            path = await client.save_state(name)
            assert path.startswith("tinker://")
