"""One TRL run of the matched task: ``GRPOTrainer`` on the example's problems, prompts and rewards.

Run with the TRL venv's python (``bench/vs_trl/setup.sh``) by ``bench/vs_trl/compare.py``.
The model is the same GGUF, loaded by the same function as HFBackend (float32,
CPU), with a peft LoRA of the same rank and alpha on every linear layer but
the head. Generation is TRL's own (``model.generate`` on the padded batch).
Prints one JSON line: seconds per step split into sampling (TRL's
``_generate_and_score_completions``) and training (the rest of the step), the
reward curve, the final greedy accuracy on the example's evaluation problems,
the peak RSS.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for bench.x, as in bench/longtail.py
from bench.vs_trl import common


def _greedy_accuracy(model: Any, tokenizer: Any, renderer: Any, problems: list[tuple[int, int]]) -> float:
    prompts = [renderer.prompt(a, b)[0].to_ints() for a, b in problems]
    width = max(len(p) for p in prompts)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=common.MAX_TOKENS, pad_token_id=pad
        )
    correct = 0
    for (a, b), row in zip(problems, out[:, width:].tolist(), strict=True):
        tokens = row[: row.index(renderer.stop[0]) + 1] if renderer.stop[0] in row else row
        text, is_number = renderer.parse(tokens)
        correct += int(is_number and int(text) == a + b)
    return correct / len(problems)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--log-path", required=True)
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    args = parser.parse_args()
    torch.set_num_threads(common.THREADS)
    import smollm2_addition as ex
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trio_rl.backends.hf import load_tokenizer, resolve_source
    from trio_rl.backends.hf.loading import load_model

    source = resolve_source(args.model)
    tokenizer = load_tokenizer(source)
    model = load_model(source, torch.device("cpu"), torch.float32)
    # The GGUF weights are de-quantized to float32 on load (as HFBackend trains them);
    # the GGUF marker left on the model would make the Trainer refuse to train it.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    ex_args = common.example_args(args.seed, args.steps)
    renderer = ex.ChatRenderer(tokenizer, ex_args.system_prompt)
    rows = [
        {"prompt": [{"role": "system", "content": ex_args.system_prompt},
                    {"role": "user", "content": f"What is {a}+{b}? Answer with the number only."}],
         "a": a, "b": b}
        for problems in common.step_problems(ex_args, renderer, args.steps)
        for a, b in problems
    ]  # fmt: skip

    def reward(completion_ids: list[list[int]], a: list[int], b: list[int], **_: Any) -> list[float]:
        out = []
        for ids, x, y in zip(completion_ids, a, b, strict=True):
            text, is_number = renderer.parse(list(ids))
            out.append(1.0 if is_number and int(text) == x + y else ex_args.format_reward if is_number else 0.0)
        return out

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-", dir=args.log_path),
        per_device_train_batch_size=common.GROUPS * common.GROUP_SIZE,
        num_generations=common.GROUP_SIZE,
        max_completion_length=common.MAX_TOKENS,
        learning_rate=common.LEARNING_RATE,
        lr_scheduler_type="constant",
        adam_beta1=common.ADAM_BETAS[0],
        adam_beta2=common.ADAM_BETAS[1],
        adam_epsilon=common.ADAM_EPS,
        weight_decay=0.0,
        max_grad_norm=0.0,  # trio_rl's default: no clipping
        scale_rewards="none",  # centred per group, not scaled
        beta=0.0,
        num_iterations=1,  # on-policy, one update per generation batch: sync
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_steps=args.steps,
        shuffle_dataset=False,  # the example's problems in the example's order
        seed=args.seed,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        remove_unused_columns=False,
        dataloader_num_workers=0,
        gradient_checkpointing=False,  # TRL turns it on by default; trio_rl does not recompute activations
        disable_tqdm=True,
    )
    sample_s: list[float] = []
    step_s: list[float] = []

    class Timed(GRPOTrainer):
        def _generate_and_score_completions(self, *a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return super()._generate_and_score_completions(*a, **k)
            finally:
                sample_s.append(time.perf_counter() - start)

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            step_s.append(time.perf_counter() - self.start)

    # peft annotates lora_alpha as int but only divides by it (alpha / r): HFBackend's float default, unrounded.
    peft_config = LoraConfig(
        r=common.LORA_RANK, lora_alpha=common.LORA_ALPHA,  # type: ignore[arg-type]
        lora_dropout=0.0, target_modules="all-linear", bias="none", task_type="CAUSAL_LM",
    )  # fmt: skip
    trainer = Timed(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[StepTimer()],
    )
    trainer.train()
    rewards = [float(h["reward"]) for h in trainer.state.log_history if "reward" in h]  # TRL logs strings
    evaluator = ex.GreedyAccuracy(renderer, ex_args)
    accuracy = _greedy_accuracy(trainer.model, tokenizer, renderer, evaluator.problems)
    train_s = [s - g for s, g in zip(step_s, sample_s, strict=True)]
    common.report("trl", args.seed, sample_s, train_s, rewards, accuracy=accuracy)


if __name__ == "__main__":
    main()
