"""Plot the arithmetic example's curves with and without in-flight weights, over seeds, from the runs' metrics.jsonl.

    for s in 0 1 2 3 4 5 6 7; do
        python examples/arithmetic.py --log-path runs/default-s$s --seed $s
        python examples/arithmetic.py --log-path runs/inflight-s$s --seed $s --inflight-weights
    done
    python bench/inflight_curves.py --out docs/images/inflight_curves.png \\
        "default=runs/default-s*" "in-flight=runs/inflight-s*"

Each argument is ``LABEL=GLOB``: the run folders matched are one mode's seeds.
Top: the mean reward per step (a 20-step running mean), averaged over the mode's
seeds; bottom: the evaluator's greedy accuracy, the mean over seeds with the band
from the lowest to the highest seed. It prints, per run, the final accuracy, the
mean of the last three evaluations and the mean reward of the last 50 steps;
then per mode the mean of each over seeds with its standard error.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, stdev

from matplotlib.figure import Figure  # a bare Figure draws with Agg: no display needed

from trio_rl.cli.plotting import series

SMOOTH = 20
LAST_REWARDS = 50


def _running_mean(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


@dataclass(frozen=True)
class _Run:
    steps: list[int]
    rewards: list[float]
    eval_steps: list[int]
    accuracy: list[float]
    final: float
    last3: float
    reward: float


def _run(folder: Path) -> _Run:
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    steps, rewards = series(records, "env/all/reward/total")
    eval_steps, accuracy = series(records, "eval/accuracy")
    return _Run(
        steps=steps,
        rewards=rewards,
        eval_steps=eval_steps,
        accuracy=accuracy,
        final=accuracy[-1],
        last3=mean(accuracy[-3:]),
        reward=mean(rewards[-LAST_REWARDS:]),
    )


def _mean_and_error(values: list[float]) -> str:
    error = stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return f"{mean(values):.3f} ± {error:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modes", nargs="+", help="LABEL=GLOB of the mode's run folders (one per seed)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    fig = Figure(figsize=(7, 5.5), dpi=80)
    reward_ax, eval_ax = fig.subplots(2, 1, sharex=True)
    for i, spec in enumerate(args.modes):
        label, pattern = spec.split("=", 1)
        folders = sorted(Path(p) for p in glob.glob(pattern) if (Path(p) / "metrics.jsonl").is_file())
        if not folders:
            raise SystemExit(f"{label}: no run folder matches {pattern}")
        runs = [_run(f) for f in folders]
        for folder, run in zip(folders, runs, strict=True):
            print(
                f"{label} {folder.name}: final eval/accuracy {run.final:.3f}, "
                f"mean of the last 3 evals {run.last3:.3f}, mean reward of the last {LAST_REWARDS} steps "
                f"{run.reward:.3f}"
            )
        finals = [r.final for r in runs]
        last3 = [r.last3 for r in runs]
        rewards = [r.reward for r in runs]
        print(
            f"{label}, {len(runs)} seeds (mean ± standard error): final {_mean_and_error(finals)}, "
            f"last 3 evals {_mean_and_error(last3)}, last {LAST_REWARDS} rewards {_mean_and_error(rewards)}\n"
        )
        color, style = f"C{i}", ("--" if i else "-")
        steps = min((r.steps for r in runs), key=len)
        per_step = [_running_mean(r.rewards, SMOOTH)[: len(steps)] for r in runs]
        reward_ax.plot(steps, [mean(col) for col in zip(*per_step, strict=True)], style, color=color, linewidth=1.2,
                       label=f"{label} ({len(runs)} seeds)")  # fmt: skip
        eval_steps = min((r.eval_steps for r in runs), key=len)
        acc = [r.accuracy[: len(eval_steps)] for r in runs]
        cols = list(zip(*acc, strict=True))
        eval_ax.plot(eval_steps, [mean(c) for c in cols], style, color=color, marker="o", markersize=3, linewidth=1.2)
        eval_ax.fill_between(eval_steps, [min(c) for c in cols], [max(c) for c in cols], color=color, alpha=0.12)
    reward_ax.set_ylabel(f"mean reward ({SMOOTH}-step mean)")
    eval_ax.set_ylabel("greedy accuracy (eval)\nmean, band: min-max")
    eval_ax.set_xlabel("training step")
    reward_ax.legend(fontsize=8)
    for ax in (reward_ax, eval_ax):
        ax.grid(alpha=0.3)
    fig.suptitle("examples/arithmetic.py on LocalBackend: async K=1, snapshot vs in-flight weights", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out)


if __name__ == "__main__":
    main()
