"""One trio_rl run of the matched task: examples/smollm2_addition.py in sync mode, as a user runs it.

Prints one JSON line: seconds per step split into sampling (the step's wall time
less ``time/train_step``) and training, the reward curve, the final greedy
accuracy, the peak RSS. Run by ``bench/vs_trl/compare.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for bench.x, as in bench/longtail.py
from bench.vs_trl import common


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--log-path", required=True)
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    args = parser.parse_args()
    import smollm2_addition as ex

    code = ex.main([
        "--model", args.model, "--log-path", args.log_path, "--mode", "sync", "--seed", str(args.seed),
        "--max-steps", str(args.steps), "--eval-every", str(args.steps), "--save-every", str(10**6),
        "--groups-per-batch", str(common.GROUPS), "--group-size", str(common.GROUP_SIZE),
        "--max-tokens", str(common.MAX_TOKENS), "--lora-rank", str(common.LORA_RANK),
        "--learning-rate", str(common.LEARNING_RATE), "--num-threads", str(common.THREADS), "--no-progress",
    ])  # fmt: skip
    assert code == 0, f"the example exited with {code}"
    records = [json.loads(line) for line in (Path(args.log_path) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "env/all/reward/total" in r]
    evals = {r["step"]: r["time/run_evals"] for r in records if "time/run_evals" in r}
    # time/total is the run's wall time so far; a step's own time is the difference, less an eval inside it.
    totals = [0.0] + [r["time/total"] for r in steps]
    wall = [totals[i + 1] - totals[i] - evals.get(r["step"], 0.0) for i, r in enumerate(steps)]
    train = [r["time/train_step"] for r in steps]
    final = [r for r in records if "eval/accuracy" in r][-1]
    common.report(
        "trio_rl",
        args.seed,
        [w - t for w, t in zip(wall, train, strict=True)],
        train,
        [r["env/all/reward/total"] for r in steps],
        accuracy=final["eval/accuracy"],
        prefill_cached=sum(r.get("tokens/prefill_cached", 0) for r in steps),
    )


if __name__ == "__main__":
    main()
