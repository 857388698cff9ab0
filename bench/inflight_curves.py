"""Plot the arithmetic example's curves with and without in-flight weights, from the runs' metrics.jsonl.

    python examples/arithmetic.py --log-path runs/default --seed 0
    python examples/arithmetic.py --log-path runs/inflight --seed 0 --inflight-weights
    python bench/inflight_curves.py --out docs/images/inflight_curves.png \\
        "default, seed 0=runs/default" "in-flight, seed 0=runs/inflight"

Top: the mean reward per step (a 20-step running mean); bottom: the evaluator's
greedy accuracy. It also prints, per run, the final accuracy, the mean of the
last three evaluations, the mean reward of the last 50 steps and the run's
``time/total``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from matplotlib.figure import Figure  # a bare Figure draws with Agg: no display needed

from trio_rl.cli.plotting import series

SMOOTH = 20


def _running_mean(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="LABEL=RUN_FOLDER")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    fig = Figure(figsize=(7, 5.5), dpi=80)
    reward_ax, eval_ax = fig.subplots(2, 1, sharex=True)
    colors: dict[str, str] = {}
    for spec in args.runs:
        label, folder = spec.split("=", 1)
        # One colour per seed (what follows the comma), solid for snapshots, dashed for in-flight.
        color = colors.setdefault(label.partition(", ")[2], f"C{len(colors)}")
        records = [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines()]
        steps, rewards = series(records, "env/all/reward/total")
        eval_steps, accuracy = series(records, "eval/accuracy")
        style = "--" if "in-flight" in label else "-"
        reward_ax.plot(steps, _running_mean(rewards, SMOOTH), style, color=color, label=label, linewidth=1.1)
        eval_ax.plot(eval_steps, accuracy, style, color=color, marker="o", markersize=2.5, linewidth=1.1)
        total = max((r["time/total"] for r in records if "time/total" in r), default=float("nan"))
        print(
            f"{label}: final eval/accuracy {accuracy[-1]:.3f}, mean of last 3 evals {sum(accuracy[-3:]) / 3:.3f}, "
            f"max {max(accuracy):.3f}, mean reward of the last 50 steps {sum(rewards[-50:]) / 50:.3f}, "
            f"time/total {total:.0f} s"
        )
    reward_ax.set_ylabel(f"mean reward ({SMOOTH}-step mean)")
    eval_ax.set_ylabel("greedy accuracy (eval)")
    eval_ax.set_xlabel("training step")
    reward_ax.legend(fontsize=7, ncol=2)
    for ax in (reward_ax, eval_ax):
        ax.grid(alpha=0.3)
    fig.suptitle("examples/arithmetic.py on LocalBackend: async K=1, snapshot vs in-flight weights", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out)


if __name__ == "__main__":
    main()
