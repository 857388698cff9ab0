"""HFBackend state: peft-layout safetensors round trips, resume, and snapshots isolated from training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import trio
from safetensors.torch import load_file
from tinker import types as tinker_types

from tests.hf_helpers import backend, train_steps, training_client
from tests.integration.tiny_model import TinyModel

PROMPT = tinker_types.ModelInput.from_ints([5, 17, 42])
PARAMS = tinker_types.SamplingParams(max_tokens=8, stop=[], seed=11)


def _only_safetensors_and_json(path: Path) -> None:
    assert {p.suffix for p in path.iterdir()} <= {".safetensors", ".json"}, list(path.iterdir())


@pytest.mark.parametrize("lora_rank", [4, 0])
async def test_save_and_resume_round_trip_with_optimizer(tmp_path: Path, tiny_model: TinyModel, lora_rank: int) -> None:
    async with training_client(tmp_path, tiny_model.path, lora_rank=lora_rank) as (be, trainer):
        await train_steps(trainer, 2)
        path = await trainer.save_state("step2")
        _only_safetensors_and_json(Path(path))
        weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        # Resume into a fresh client: the same weights, moments and step count ...
        resumed = await be.create_training_client_from_state(path)
        assert resumed.adam_state.step == 2
        got = {n: p.detach() for n, p in resumed.model.named_parameters() if p.requires_grad}
        assert got.keys() == weights.keys()
        for n in weights:
            assert torch.equal(got[n], weights[n]), n
        for n, m in trainer.adam_state.exp_avg.items():
            assert torch.equal(resumed.adam_state.exp_avg[n], m)
            assert torch.equal(resumed.adam_state.exp_avg_sq[n], trainer.adam_state.exp_avg_sq[n])
        # ... so the next step lands exactly where the original's does.
        await train_steps(trainer, 1)
        await train_steps(resumed, 1)
        for n, p in trainer.model.named_parameters():
            if p.requires_grad:
                assert torch.equal(dict(resumed.model.named_parameters())[n].detach(), p.detach()), n
        # load_state rewinds; without the optimizer Adam restarts.
        await trainer.load_state(path, with_optimizer=False)
        assert trainer.adam_state.step == 0
        for n, p in trainer.model.named_parameters():
            if n in weights:
                assert torch.equal(p.detach(), weights[n]), n
        # The folder lives while its client does: hold the client.
        sampler = await trainer.save_weights_for_sampler("w")
        sampler_path = sampler.model_path
        assert sampler_path is not None
        _only_safetensors_and_json(Path(sampler_path))
        with pytest.raises(ValueError, match="no optimizer state"):
            await trainer.load_state(sampler_path)


async def test_a_lora_checkpoint_loads_with_peft_from_pretrained(tmp_path: Path, tiny_model: TinyModel) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    async with training_client(tmp_path, tiny_model.path) as (_, trainer):
        await train_steps(trainer, 2)
        path = await trainer.save_state("s")
        x = torch.tensor([PROMPT.to_ints()])
        with torch.no_grad():
            ours = trainer.model(input_ids=x).logits
    config = json.loads((Path(path) / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    assert all(".lora_" in k for k in load_file(Path(path) / "adapter_model.safetensors"))
    base = AutoModelForCausalLM.from_pretrained(tiny_model.path, local_files_only=True)
    loaded = PeftModel.from_pretrained(base, path).eval()
    with torch.no_grad():
        theirs = loaded(input_ids=x).logits
        with loaded.disable_adapter():
            plain = loaded(input_ids=x).logits
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain, ours, atol=1e-4)  # the adapter was trained: it matters


async def test_lora_snapshots_do_not_move_with_later_steps(tmp_path: Path, tiny_model: TinyModel) -> None:
    async with training_client(tmp_path, tiny_model.path) as (_, trainer):
        await train_steps(trainer, 1)
        before = await trainer.save_weights_for_sampler("before")
        first = await before.sample(PROMPT, 2, PARAMS)
        scored = await before.compute_logprobs(PROMPT)
        await train_steps(trainer, 3)
        after = await trainer.save_weights_for_sampler("after")
        # The old snapshot samples exactly as before; the new one from other weights.
        again = await before.sample(PROMPT, 2, PARAMS)
        assert [s.tokens for s in again.sequences] == [s.tokens for s in first.sequences]
        assert [s.logprobs for s in again.sequences] == [s.logprobs for s in first.sequences]
        assert await before.compute_logprobs(PROMPT) == scored
        assert await after.compute_logprobs(PROMPT) != scored
        # Snapshots are adapters, not trained parameters, and a dropped one's adapter is reused.
        trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        assert trained and all(".default." in n for n in trained)
        assert set(trainer.adam_state.exp_avg) == set(trained)
        adapters = set(trainer.model.peft_config)
        assert {"default"} < adapters
        del before, after, first, again
        import gc

        gc.collect()
        await train_steps(trainer, 1)  # the next job takes the retired adapters back
        for step in range(5):
            newest = await trainer.save_weights_for_sampler(f"again-{step}")
            assert await newest.compute_logprobs(PROMPT) != scored
        assert set(trainer.model.peft_config) == adapters
        trained_now = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        assert trained_now == trained


async def test_missing_model_names_the_path(tmp_path: Path) -> None:
    with trio.fail_after(10):
        async with backend(tmp_path) as be:
            with pytest.raises(FileNotFoundError, match="no-such-model"):
                await be.create_training_client(base_model=str(tmp_path / "no-such-model"))
            with pytest.raises(FileNotFoundError, match="not an HF backend checkpoint"):
                await be.create_training_client_from_state(str(tmp_path))


async def test_a_caller_and_the_backend_share_one_tokenizer_load(tmp_path: Path, tiny_model: TinyModel) -> None:
    from trio_rl.backends.hf import load_tokenizer, resolve_source

    mine = load_tokenizer(resolve_source(str(tiny_model.path)))
    async with training_client(tmp_path, str(tiny_model.path)) as (_, trainer):
        assert await trainer.get_tokenizer() is mine


async def test_sampler_snapshots_keep_the_disk_and_the_adapters_bounded_over_50_steps(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    async with training_client(tmp_path, tiny_model.path, deadline_s=120) as (_, trainer):
        # As the loop does: the newest sampler replaces the one before, a state every 20 steps.
        sampler = await trainer.save_weights_for_sampler("000000")
        for step in range(1, 51):
            await train_steps(trainer, 1)
            sampler = await trainer.save_weights_for_sampler(f"{step:06d}")
            if step % 20 == 0:
                await trainer.save_state(f"{step:06d}")
            folders = sorted(p.name for p in (tmp_path / "sampler_weights").iterdir())
            kept = [f"{s:06d}" for s in (20, 40) if s < step]
            assert folders == sorted({*kept, f"{step:06d}"}), (step, folders)
            assert len(trainer.model.peft_config) <= 3
        assert sampler.model_path == str(tmp_path / "sampler_weights" / "000050")
