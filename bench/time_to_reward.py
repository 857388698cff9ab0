"""Time to reward: how soon, on the real clock, each async mode makes a run reach a reward fixed in advance.

    python bench/time_to_reward.py run --out runs/ttr/results.jsonl --seeds 0 1 2 --steps 60
    python bench/time_to_reward.py report --results runs/ttr/results.jsonl --plot docs/images/time_to_reward.png

The task is ``examples/repeat_letters.py`` on LocalBackend: answers of 1 to 16
letters, the count drawn with probability proportional to 1 / count, and a
random policy's answers running to ``max_tokens``, so rollouts' lengths have a
long tail. ``run`` trains every mode of ``--modes`` for every seed, the modes
in an order that rotates with the seed (the sides alternate, so a change in the
machine's load falls on all of them), one run at a time, each to ``--steps``
training steps. Each run appends one JSON line to ``--out`` as soon as it ends
(so a sweep cut short keeps every finished run), with the load average
(``os.getloadavg``) before and after it.

Two measures per run, each against thresholds fixed here before any run
(:data:`THRESHOLDS`): the greedy evaluation's mean reward (``eval/reward``,
every ``--eval-every`` steps, timed at the moment the evaluated step's record
was written, so the evaluation's own latency does not count), and the
training reward (``env/all/reward/total``, a 5-step running mean, timed at its
step's record). ``report`` gives, per mode, the median seconds to each
threshold with the lowest and highest, the runs that never reached it
(counted, not dropped), and the final quality (the mean of the last two
evaluations and of the last 10 steps' reward) with its standard error across
seeds; and the plot of evaluation reward against wall-clock time, one curve
per mode (the mean over seeds on a common time grid) with a band of one
standard error.

Modes (:data:`MODES`): ``sync``; ``oldest_first`` at K = 1, 2, 4; in-flight
weights at K = 2, 4, 8; ``pace`` at K = 2; and, at in-flight K = 8 (the most
staleness), every loss: plain importance sampling and each correction. The
async modes train ``AsyncConfig.loss_fn=None``, the backend's default (token
TIS, cap 2). The sync mode trains ``importance_sampling``, as the example.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import time
from pathlib import Path
from statistics import mean, median, stdev
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from trio_rl import AsyncConfig, Config, train  # noqa: E402
from trio_rl.backends.local import CharTokenizer, LocalBackend, ModelConfig  # noqa: E402
from trio_rl.cli import LazyTokenizer, parse_args  # noqa: E402

THRESHOLDS: dict[str, tuple[float, ...]] = {"eval/reward": (0.4, 0.6), "train/reward": (0.4, 0.6)}
"""Fixed before the first run of the sweep; never tuned on its results."""

TRAIN_SMOOTH = 5
"""Steps in the running mean of the training reward."""

PLAIN_IS: dict[str, Any] = {"loss_fn": "importance_sampling"}
MODES: dict[str, dict[str, Any] | None] = {
    "sync": None,
    "oldest_first K=1": {"max_steps_off_policy": 1},
    "oldest_first K=2": {"max_steps_off_policy": 2},
    "oldest_first K=4": {"max_steps_off_policy": 4},
    "in-flight K=2": {"max_steps_off_policy": 2, "inflight_weights": True},
    "in-flight K=4": {"max_steps_off_policy": 4, "inflight_weights": True},
    "in-flight K=8": {"max_steps_off_policy": 8, "inflight_weights": True},
    "pace K=2": {"max_steps_off_policy": 2, "staleness": "pace"},
    "in-flight K=8 plain IS": {"max_steps_off_policy": 8, "inflight_weights": True, **PLAIN_IS},
    "in-flight K=8 MIS": {"max_steps_off_policy": 8, "inflight_weights": True, "_config": {"mis_cap": 2.0}},
    "in-flight K=8 ICEPOP": {
        "max_steps_off_policy": 8,
        "inflight_weights": True,
        "_config": {"icepop_low": 0.5, "icepop_high": 5.0},
    },
    "in-flight K=8 geo mask": {
        "max_steps_off_policy": 8,
        "inflight_weights": True,
        "_config": {"geo_mask_low": 0.99, "geo_mask_high": 1.01},
    },
}
"""Each mode's ``AsyncConfig`` fields (None: sync); ``_config`` is a ``loss_fn_config`` in place of the default's."""

MODEL = ModelConfig(d_model=48, n_layers=2, n_heads=4, d_ff=128, max_seq_len=32)


def _config(mode: str, seed: int, log_path: Path, size: argparse.Namespace) -> Config:
    fields = MODES[mode]
    common: dict[str, Any] = {
        "log_path": log_path,
        "learning_rate": size.learning_rate,
        "max_tokens": 24,
        "max_steps": size.steps,
        "eval_every": size.eval_every,
        "save_every": 0,
        "seed": seed,
        "overwrite": True,
    }
    if fields is None:
        return Config(loss_fn="importance_sampling", **common)
    fields = dict(fields)
    loss_config = fields.pop("_config", None)
    return Config(
        loss_fn_config=loss_config, async_config=AsyncConfig(groups_per_batch=size.groups, **fields), **common
    )


async def _one_run(mode: str, seed: int, folder: Path, size: argparse.Namespace) -> dict[str, Any]:
    repeat = importlib.import_module("repeat_letters")
    tokenizer = CharTokenizer(repeat.ALPHABET)
    args = parse_args(repeat.Args, [], groups_per_batch=size.groups, group_size=size.group_size)
    args.config = Config(log_path=folder, seed=seed)
    renderer = repeat.Renderer(LazyTokenizer(tokenizer))
    dataset = repeat.RepeatDataset(args, renderer, num_batches=4 * size.steps + 8)
    evaluator = repeat.ExactEvaluator(renderer, args.max_count, 24)
    config = _config(mode, seed, folder, size)
    arrivals: dict[int, float] = {}
    start = time.perf_counter()
    backend = LocalBackend(log_dir=folder / "backend", model_config=MODEL, tokenizer=tokenizer, seed=seed)
    async with backend, trio.open_nursery() as nursery:

        async def run(task_status: trio.TaskStatus[Any]) -> None:
            await train(config, dataset=dataset, backend=backend, evaluators=[evaluator], task_status=task_status)

        handle = await nursery.start(run)
        async for record in handle.metrics:
            if "progress/groups" in record:
                arrivals.setdefault(int(record["step"]), time.perf_counter() - start)
    wall = time.perf_counter() - start
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return _summarise(records, arrivals, wall)


def _summarise(records: list[dict[str, Any]], arrivals: dict[int, float], wall: float) -> dict[str, Any]:
    """Per step: its record's time and training reward; per evaluated step: its greedy reward and exact fraction."""
    steps = sorted(arrivals)
    by_step: dict[int, dict[str, Any]] = {}
    for record in records:
        by_step.setdefault(int(record["step"]), {}).update(record)
    rewards = [float(by_step[s]["env/all/reward/total"]) for s in steps]
    evals = sorted((s, r) for s, r in by_step.items() if "eval/reward" in r)
    # An evaluation of step s's weights: the weights existed once step s - 1's record was written (0: the start).
    eval_times = [arrivals.get(s - 1, 0.0) if s > 0 else 0.0 for s, _ in evals]
    return {
        "step_times": [arrivals[s] for s in steps],
        "train_reward": rewards,
        "eval_steps": [s for s, _ in evals],
        "eval_times": eval_times,
        "eval_reward": [float(r["eval/reward"]) for _, r in evals],
        "eval_exact": [float(r["eval/exact"]) for _, r in evals],
        "token_lag_mean": mean(float(by_step[s].get("async/token_lag_mean", 0.0)) for s in steps) if steps else 0.0,
        "wall_s": wall,
    }


def run_folder(results: Path, mode: str, seed: int) -> Path:
    """Where a run of ``mode`` and ``seed`` keeps its folder, beside the results file."""
    return results.parent / "runs" / f"{mode.replace(' ', '_').replace('=', '')}-s{seed}"


def weight_statistics(results: Path, runs: list[dict[str, Any]]) -> str:
    """The mean over the runs' steps of ``offpolicy/corrected_frac``, ``ess`` and ``is_weight_max``, from their
    ``metrics.jsonl`` (``-`` where the folders are gone)."""
    values: dict[str, list[float]] = {"corrected_frac": [], "ess": [], "is_weight_max": []}
    for run in runs:
        path = run_folder(results, run["mode"], run["seed"]) / "metrics.jsonl"
        if not path.exists():
            return "-"
        for line in path.read_text().splitlines():
            record = json.loads(line)
            for key, found in values.items():
                if f"offpolicy/{key}" in record:
                    found.append(float(record[f"offpolicy/{key}"]))
    if not values["ess"]:
        return "-"
    return " / ".join(f"{mean(found):.3g}" for found in values.values())


def _rotated(modes: list[str], seed: int) -> list[str]:
    shift = seed % len(modes)
    return modes[shift:] + modes[:shift]


def run_sweep(options: argparse.Namespace) -> None:
    out = Path(options.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    modes = options.modes or list(MODES)
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"unknown modes {unknown}; choose from {list(MODES)}")
    for seed in options.seeds:
        for mode in _rotated(modes, seed):
            folder = run_folder(out, mode, seed)
            load_before = os.getloadavg()
            summary = trio.run(_one_run, mode, seed, folder, options)
            line = {
                "mode": mode,
                "seed": seed,
                "steps": options.steps,
                "groups": options.groups,
                "group_size": options.group_size,
                "load_before": load_before,
                "load_after": os.getloadavg(),
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **summary,
            }
            with out.open("a") as file:
                file.write(json.dumps(line) + "\n")
            print(
                f"{mode} seed {seed}: {summary['wall_s']:.0f} s, final eval {summary['eval_reward'][-1]:.3f}",
                flush=True,
            )


def time_to(times: list[float], values: list[float], threshold: float) -> float | None:
    """The first time a value reaches ``threshold``, or None if none does."""
    return next((t for t, v in zip(times, values, strict=True) if v >= threshold), None)


def _smoothed(values: list[float]) -> list[float]:
    return [mean(values[max(0, i - TRAIN_SMOOTH + 1) : i + 1]) for i in range(len(values))]


def _se(values: list[float]) -> float:
    return stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")


def report(options: argparse.Namespace) -> None:
    lines = [json.loads(line) for line in Path(options.results).read_text().splitlines() if line.strip()]
    modes = [m for m in MODES if any(r["mode"] == m for r in lines)]
    loads = [x for r in lines for x in (r["load_before"][0], r["load_after"][0])]
    print(
        f"{len(lines)} runs, {lines[0]['date']} to {lines[-1]['date']}; 1-min load from {min(loads):.1f} to {max(loads):.1f}"
    )
    header = ["mode", "seeds", "s/run"]
    header += [f"eval>={t}" for t in THRESHOLDS["eval/reward"]] + [f"train>={t}" for t in THRESHOLDS["train/reward"]]
    header += ["final eval reward", "final exact", "last-10 train reward", "token lag"]
    header += ["corrected / ESS / max w"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for mode in modes:
        runs = [r for r in lines if r["mode"] == mode]
        cells = [mode, str(len(runs)), f"{median(r['wall_s'] for r in runs):.0f}"]
        cells += [_time_cell(runs, key, t) for key, thresholds in THRESHOLDS.items() for t in thresholds]
        finals = [mean(r["eval_reward"][-2:]) for r in runs]
        exact = [mean(r["eval_exact"][-2:]) for r in runs]
        trains = [mean(r["train_reward"][-10:]) for r in runs]
        cells += [f"{mean(v):.3f} ± {_se(v):.3f}" for v in (finals, exact, trains)]
        cells.append(f"{mean(r['token_lag_mean'] for r in runs):.2f}")
        cells.append(weight_statistics(Path(options.results), runs))
        print("| " + " | ".join(cells) + " |")
    if options.plot:
        _plot(lines, modes, Path(options.plot))


def _time_cell(runs: list[dict[str, Any]], key: str, threshold: float) -> str:
    times = []
    for run in runs:
        if key == "eval/reward":
            times.append(time_to(run["eval_times"], run["eval_reward"], threshold))
        else:
            times.append(time_to(run["step_times"], _smoothed(run["train_reward"]), threshold))
    reached = sorted(t for t in times if t is not None)
    missed = len(times) - len(reached)
    if not reached:
        return f"never ({missed}/{len(times)})"
    cell = f"{median(reached):.0f} s [{reached[0]:.0f}-{reached[-1]:.0f}]"
    return cell + (f", {missed}/{len(times)} never" if missed else "")


def _plot(lines: list[dict[str, Any]], modes: list[str], path: Path) -> None:
    from matplotlib.figure import Figure  # a bare Figure draws with Agg: no display needed

    figure = Figure(figsize=(9, 5.5))
    axes = figure.subplots()
    horizon = max(max(r["eval_times"]) for r in lines)
    grid = [horizon * i / 100 for i in range(101)]
    for index, mode in enumerate(modes):
        runs = [r for r in lines if r["mode"] == mode]
        # Each run's curve holds its last evaluation until the next; past its end it is left out.
        curves = [[_held(r["eval_times"], r["eval_reward"], t) for t in grid] for r in runs]
        points = [(t, [v for c in curves if (v := c[i]) is not None]) for i, t in enumerate(grid)]
        points = [(t, v) for t, v in points if len(v) == len(runs)]
        xs = [t for t, _ in points]
        ys = [mean(v) for _, v in points]
        errors = [_se(v) if len(v) > 1 else 0.0 for _, v in points]
        # Matplotlib's colour cycle has 10 colours: the modes after them are dashed.
        style = "-" if index < 10 else "--"
        (line,) = axes.plot(xs, ys, style, label=f"{mode} ({len(runs)} seeds)")
        axes.fill_between(
            xs,
            [y - e for y, e in zip(ys, errors, strict=True)],
            [y + e for y, e in zip(ys, errors, strict=True)],
            color=line.get_color(),
            alpha=0.15,
        )
    for threshold in THRESHOLDS["eval/reward"]:
        axes.axhline(threshold, color="grey", linewidth=0.5, linestyle=":")
    axes.set_xlabel("wall-clock seconds")
    axes.set_ylabel("greedy evaluation reward (mean over seeds, band: 1 s.e.)")
    axes.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    print(f"plot: {path}")


def _held(times: list[float], values: list[float], t: float) -> float | None:
    if t > times[-1]:
        return None
    held = values[0]
    for time_, value in zip(times, values, strict=True):
        if time_ <= t:
            held = value
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sweep = commands.add_parser("run", help="train every mode for every seed, appending to --out")
    sweep.add_argument("--out", required=True)
    sweep.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    sweep.add_argument("--modes", nargs="*", help=f"a subset of {list(MODES)}")
    sweep.add_argument("--steps", type=int, default=200, help="training steps per run")
    sweep.add_argument("--groups", type=int, default=8, help="groups per step")
    sweep.add_argument("--group-size", type=int, default=8)
    sweep.add_argument("--eval-every", type=int, default=10)
    sweep.add_argument("--learning-rate", type=float, default=1e-3)
    summary = commands.add_parser("report", help="the table (markdown) and the plot of a results file")
    summary.add_argument("--results", required=True)
    summary.add_argument("--plot", help="where to write the plot (PNG)")
    options = parser.parse_args()
    if options.command == "run":
        run_sweep(options)
    else:
        report(options)


if __name__ == "__main__":
    main()
