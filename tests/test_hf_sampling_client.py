"""``HFBackend.create_sampling_client``: a base model's own weights, or saved weights, as a sampler.

``trio_rl.train`` asks for one for the KL penalty's reference model and for each
evaluation a resumed run still owes; both are run here through ``train`` too.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest
import trio
from tinker import types as tinker_types

from tests.hf_helpers import backend, run_config, train_steps, training_client
from tests.integration.tiny_model import TinyModel
from tests.test_hf_learning import EvenTokensDataset
from trio_rl import Config, KLReferenceConfig, train
from trio_rl.backends.protocol import SamplingClient
from trio_rl.base.jsonl import RunFolderWarning
from trio_rl.loop.checkpoints import CheckpointLog

SEQUENCE = tinker_types.ModelInput.from_ints([5, 17, 42, 99, 7, 3, 250])
PROMPT = tinker_types.ModelInput.from_ints([5, 17, 42])
PARAMS = tinker_types.SamplingParams(max_tokens=6, stop=[], seed=3)


def _assert_same(got: list[float | None], want: list[float | None]) -> None:
    # Bit for bit: the same weights in the same layout, scored one sequence at a time on the CPU.
    assert got[0] is None and len(got) == len(want) > 1
    assert got == want


@pytest.mark.parametrize("lora_rank", [4, 0])
async def test_a_base_model_sampler_scores_as_the_untrained_policy(
    tmp_path: Path, peaked_tiny_model: TinyModel, lora_rank: int
) -> None:
    async with training_client(tmp_path, peaked_tiny_model.path, lora_rank=lora_rank) as (be, trainer):
        untrained = await (await trainer.save_weights_for_sampler("s0")).compute_logprobs(SEQUENCE)
        await train_steps(trainer, 2)
        trained = await (await trainer.save_weights_for_sampler("s2")).compute_logprobs(SEQUENCE)
        base = await be.create_sampling_client(base_model=peaked_tiny_model.path)
        assert base.model_path is None
        # A fresh LoRA adapter adds exactly nothing, so the base model is the untrained policy;
        # the trained one has moved away from it.
        _assert_same(await base.compute_logprobs(SEQUENCE), untrained)
        assert trained[1:] != pytest.approx(untrained[1:], abs=1e-3)
        # It samples too, and training the policy further does not move it.
        first = await base.sample(PROMPT, 2, PARAMS)
        await train_steps(trainer, 1)
        again = await base.sample(PROMPT, 2, PARAMS)
        assert [s.tokens for s in again.sequences] == [s.tokens for s in first.sequences]
        assert all(len(s.tokens) == 6 for s in first.sequences)


@pytest.mark.parametrize("lora_rank", [4, 0])
async def test_a_saved_sampler_or_state_scores_as_the_training_clients_own_sampler(
    tmp_path: Path, peaked_tiny_model: TinyModel, lora_rank: int
) -> None:
    async with training_client(tmp_path, peaked_tiny_model.path, lora_rank=lora_rank) as (be, trainer):
        await train_steps(trainer, 2)
        own = await trainer.save_weights_for_sampler("w2")
        state = await trainer.save_state("s2")
        assert own.model_path is not None
        want = await own.compute_logprobs(SEQUENCE)
        want_sample = await own.sample(PROMPT, 2, PARAMS)
        await train_steps(trainer, 1)  # the trainer moves on; the folders keep step 2's weights
        for path in (own.model_path, state):
            loaded = await be.create_sampling_client(base_model=peaked_tiny_model.path, model_path=path)
            assert loaded.model_path == path
            _assert_same(await loaded.compute_logprobs(SEQUENCE), want)
            got_sample = await loaded.sample(PROMPT, 2, PARAMS)
            assert [s.tokens for s in got_sample.sequences] == [s.tokens for s in want_sample.sequences]


async def test_bad_paths_and_an_unentered_backend_are_named(tmp_path: Path, tiny_model: TinyModel) -> None:
    be = backend(tmp_path / "hf")
    with pytest.raises(RuntimeError, match="enter"):
        await be.create_sampling_client(base_model=tiny_model.path)
    with trio.fail_after(60):
        async with be:
            missing = tmp_path / "nowhere"
            with pytest.raises(FileNotFoundError, match=str(missing)):
                await be.create_sampling_client(base_model=str(missing))
            with pytest.raises(FileNotFoundError, match=str(missing)):
                await be.create_sampling_client(base_model=tiny_model.path, model_path=str(missing))
            not_a_checkpoint = tmp_path / "empty"
            not_a_checkpoint.mkdir()
            with pytest.raises(FileNotFoundError, match=f"{not_a_checkpoint} is not an HF backend checkpoint"):
                await be.create_sampling_client(base_model=tiny_model.path, model_path=str(not_a_checkpoint))


async def test_a_run_with_a_kl_penalty_against_the_base_model_trains_on_hf_backend(
    tmp_path: Path, peaked_tiny_model: TinyModel
) -> None:
    config = run_config(
        tmp_path / "run",
        peaked_tiny_model.path,
        max_tokens=4,
        max_steps=3,
        kl_penalty_coef=0.1,
        kl_reference_config=KLReferenceConfig(peaked_tiny_model.path),
    )
    with trio.fail_after(120):
        async with backend(tmp_path / "hf") as be:
            result = await train(config, dataset=EvenTokensDataset(), backend=be)
    kl = [m["kl_policy_base"] for m in result.step_metrics]
    assert len(kl) == 3
    # Step 0 samples from the untrained policy, which is the base model: no divergence but
    # float noise between batched decoding and scoring. Trained weights diverge.
    assert abs(kl[0]) < 1e-4
    assert abs(kl[-1]) > 1e-3, kl


class _ScoreOrHang:
    """Records each evaluated client's logprobs of ``SEQUENCE``; ``hang_on`` (a call index) never returns."""

    def __init__(self, hang_on: int | None = None) -> None:
        self.hang_on = hang_on
        self.scored: list[list[float | None]] = []
        self.paths: list[str | None] = []

    async def __call__(self, sampling_client: SamplingClient) -> dict[str, float]:
        if len(self.scored) == self.hang_on:
            self.scored.append([])
            await trio.sleep_forever()
        self.scored.append(await sampling_client.compute_logprobs(SEQUENCE))
        self.paths.append(sampling_client.model_path)
        return {"test/scored": 1.0}


def _owing_config(tmp_path: Path, model: TinyModel, save_every: int, **extra: object) -> Config:
    return run_config(
        tmp_path / "run",
        model.path,
        lora_rank=4,
        learning_rate=5e-2,
        max_tokens=4,
        max_steps=6,
        eval_every=2,
        save_every=save_every,
        save_on_cancel=True,
        **extra,
    )


async def _cancel_owing_step_2(tmp_path: Path, model: TinyModel, save_every: int) -> str:
    """Run until step 3's record with step 2's evaluation hanging, then cancel; the owed sampler path."""
    hang = _ScoreOrHang(hang_on=1)  # step 0's evaluation runs; step 2's never ends
    config = _owing_config(tmp_path, model, save_every)
    with trio.fail_after(120):
        async with backend(tmp_path / "hf") as be, trio.open_nursery() as nursery:
            handle = await nursery.start(
                partial(train, config, dataset=EvenTokensDataset(), backend=be, evaluators=(hang,))
            )
            async for record in handle.metrics:
                if record.get("step") == 3 and "env/all/reward/total" in record:
                    nursery.cancel_scope.cancel()
    saved = CheckpointLog(tmp_path / "run").last()
    assert saved is not None and saved.reason == "cancelled" and saved.step >= 3
    ((owed_step, owed_path),) = saved.owed_evaluations
    assert owed_step == 2 and owed_path is not None
    return owed_path


async def test_a_resumed_hf_run_runs_the_evaluation_it_owed_on_that_steps_weights(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    owed_path = await _cancel_owing_step_2(tmp_path, tiny_model, save_every=2)
    (step_2,) = [c for c in CheckpointLog(tmp_path / "run").all() if c.step == 2]
    scorer = _ScoreOrHang()
    with trio.fail_after(120):
        async with backend(tmp_path / "hf") as be:
            config = _owing_config(tmp_path, tiny_model, 2, resume=True)
            await train(config, dataset=EvenTokensDataset(), backend=be, evaluators=(scorer,))
            # Step 2's weights, from the state saved then, as a training client's own sampler.
            trainer = await be.create_training_client_from_state(step_2.state_path)
            want = await (await trainer.save_weights_for_sampler("check")).compute_logprobs(SEQUENCE)
    # The owed evaluation ran first, on step 2's weights; the final one's differ.
    assert scorer.paths[0] == owed_path
    _assert_same(scorer.scored[0], want)
    assert len(scorer.scored) >= 2 and scorer.scored[-1][1:] != pytest.approx(want[1:], abs=1e-4)


async def test_an_owed_evaluation_whose_sampler_folder_is_gone_is_named_and_the_resume_goes_on(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    # No state was saved at step 2, so its sampler folder went with its last client.
    owed_path = await _cancel_owing_step_2(tmp_path, tiny_model, save_every=4)
    assert not await trio.Path(owed_path).exists()
    scorer = _ScoreOrHang()
    with (
        trio.fail_after(120),
        pytest.warns(RunFolderWarning, match=f"step 2 .*its weights are gone .*{re.escape(owed_path)}"),
    ):
        async with backend(tmp_path / "hf") as be:
            config = _owing_config(tmp_path, tiny_model, 4, resume=True)
            result = await train(config, dataset=EvenTokensDataset(), backend=be, evaluators=(scorer,))
    assert result.final_step == 6 and owed_path not in scorer.paths and scorer.scored
