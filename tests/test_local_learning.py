"""LocalBackend end to end: the policy learns, and sync runs repeat bit for bit."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import trio

from tests.conftest import load_example
from trio_rl import Config, TrainResult, train
from trio_rl.backends.local import CharTokenizer, LocalBackend, ModelConfig
from trio_rl.cli import LazyTokenizer, parse_args


def run_arithmetic(log_path: Path, steps: int, *, model: ModelConfig, **config: Any) -> TrainResult:
    """Sync RL on the arithmetic example's env, straight through ``train``."""
    arithmetic = load_example("arithmetic")
    args = parse_args(arithmetic.Args, [], groups_per_batch=16, group_size=8)
    tokenizer = CharTokenizer(arithmetic.ALPHABET)
    dataset = arithmetic.AdditionDataset(args, arithmetic.Renderer(LazyTokenizer(tokenizer)), num_batches=steps)
    cfg = Config(**{"log_path": log_path, "max_tokens": 1, "eval_every": 0, "save_every": 0, "seed": 0, **config})

    async def main() -> TrainResult:
        async with LocalBackend(log_dir=log_path, model_config=model, tokenizer=tokenizer, seed=0) as backend:
            return await train(cfg, dataset=dataset, backend=backend)

    return trio.run(main)


def test_reward_improves_within_a_few_dozen_steps(tmp_path: Path) -> None:
    model = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=128, max_seq_len=16)
    result = run_arithmetic(tmp_path, 40, model=model, learning_rate=3e-3)
    rewards = [m["env/all/reward/total"] for m in result.step_metrics]
    assert len(rewards) == 40
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    # The random policy earns about 0.15 (mostly partial credit); learning roughly doubles it.
    assert first < 0.25 and last > first + 0.15, rewards


def weights_hash(result: TrainResult) -> str:
    assert result.checkpoint is not None
    return hashlib.sha256(Path(result.checkpoint.state_path, "weights.safetensors").read_bytes()).hexdigest()


def test_sync_runs_with_the_same_seed_give_bit_identical_weights(tmp_path: Path) -> None:
    model = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16)
    a = run_arithmetic(tmp_path / "a", 4, model=model, learning_rate=3e-3)
    b = run_arithmetic(tmp_path / "b", 4, model=model, learning_rate=3e-3)
    assert a.final_step == b.final_step == 4
    assert weights_hash(a) == weights_hash(b)
    # The weights did move: a third run trained one step less ends elsewhere.
    c = run_arithmetic(tmp_path / "c", 3, model=model, learning_rate=3e-3)
    assert weights_hash(c) != weights_hash(a)


def test_on_policy_the_sampler_and_the_learner_agree_and_kl_penalty_runs(tmp_path: Path) -> None:
    model = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16)
    result = run_arithmetic(tmp_path / "a", 2, model=model, learning_rate=3e-3)
    for record in result.step_metrics:
        # Sync and on-policy at temperature 1: forward_backward sees the weights that sampled.
        assert abs(record["optim/kl_sample_train_v1"]) < 1e-4 and record["optim/kl_sample_train_v2"] < 1e-8
        assert record["optim/entropy"] > 0
    from trio_rl import KLReferenceConfig

    penalised = run_arithmetic(
        tmp_path / "b", 2, model=model, learning_rate=3e-3,
        kl_penalty_coef=0.5, kl_reference_config=KLReferenceConfig("trio-rl-tiny"),
    )  # fmt: skip
    first, second = penalised.step_metrics
    # The reference is the initial weights: step 0 samples from them exactly, step 1 no longer does.
    assert abs(first["kl_policy_base"]) < 1e-4
    assert abs(second["kl_policy_base"]) > abs(first["kl_policy_base"])
def test_sampler_snapshots_are_deleted_once_unused_unless_a_checkpoint_shares_their_step(tmp_path: Path) -> None:
    model = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16)
    run_arithmetic(tmp_path, 30, model=model, learning_rate=3e-3, save_every=10)
    import gc

    gc.collect()
    kept = sorted(p.name for p in (tmp_path / "sampler_weights").iterdir())
    # Not one folder per step: only those of the saved states are left.
    assert kept == ["000010", "000020", "000030"]


def test_the_final_rows_sampler_weights_outlive_the_run(tmp_path: Path) -> None:
    # The cookbook's sampling tools load a row's sampler_path: the final one must still exist
    # when the final step is not a periodic one.
    model = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16)
    result = run_arithmetic(tmp_path, 3, model=model, learning_rate=3e-3, save_every=2)
    import gc

    gc.collect()
    assert result.checkpoint is not None and result.checkpoint.name == "final"
    assert result.checkpoint.sampler_path is not None and Path(result.checkpoint.sampler_path).is_dir()


def test_prompt_tokens_served_from_the_prefix_cache_are_counted_as_prefill_cached(tmp_path: Path) -> None:
    model = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16)
    result = run_arithmetic(tmp_path, 2, model=model, learning_rate=3e-3)
    for record in result.step_metrics:
        cached, uncached = record["tokens/prefill_cached"], record["tokens/prefill_uncached"]
        # A group's 8 envs share one prompt: the engine prefills it once and serves the rest from its cache.
        assert cached > 0, record
        assert cached + uncached == record["env/all/total_ob_tokens"], record
        assert uncached < record["env/all/total_ob_tokens"] / 2, record
