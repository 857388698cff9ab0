"""trio_rl against tinker-cookbook 0.6.1's own RL loop, side by side on one fake work model.

Run: ``bash bench/vs_cookbook/run.sh`` (it builds both virtual environments first; extra
arguments come here, e.g. ``--quick``, ``--reps 5``, ``--requeue``, ``--cells b,c``).

Both sides train the cells of ``bench/pipeline.py`` (8 groups x 4 samples per step, one
turn, S seconds per sample call, T per forward_backward) in sync and in async K=1 mode,
one fresh process per run, the two sides alternating run by run (and which goes first
alternating by repetition). Each run is timed from inside its process around the
training call only: imports and interpreter start are left out on both sides.

With ``--longtail`` it runs the long-tail cell instead (``bench/longtail_workload.py``,
issue 20): tinker-cookbook 0.6.1's ``do_async_training`` against every trio_rl async
policy, at K = 1, 2, 4 (``--ks``), in real time, on identical response lengths, the
sides alternating run by run; ``--steps`` shortens it (100 by default, minutes per run).
It prints each run, then per K and loop the median makespan, its ratio to the
sampler-bound limit and to the cookbook's, the groups trained, the mean group
staleness, the token-weighted mean lag and the sampler's utilisation.

Reported per cell, mode and side, as median [min-max] over the repetitions:
makespan / ideal (``bench/pipeline.py``'s ideal schedule for the steps trained), CPU
microseconds per trained group (the whole process: fakes and envs included), excess
milliseconds per step ((makespan - ideal) / steps) and samples wasted (sample calls
beyond those trained). Then the machine, its load average, and every difference in
work the two sides' counters show.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))  # for bench.x, as in bench/longtail.py
# bench/longtail.py: the long-tail rows and their policies; bench/pipeline.py: the cells and the ideal schedule.
from bench import longtail, longtail_workload, pipeline  # noqa: E402

RUN_TIMEOUT_S = 300
LONGTAIL_RUN_TIMEOUT_S = 900


@dataclass(frozen=True)
class Side:
    label: str
    python: Path
    script: Path
    mode_arg: str
    k: int


def sides_for(mode: str, args: argparse.Namespace) -> list[Side]:
    trio_python = Path(args.trio_python)
    cookbook_python = Path(args.cookbook_python)
    trio_script, cookbook_script = HERE / "trio_side.py", HERE / "cookbook_side.py"
    if mode == "sync":
        return [
            Side("trio_rl", trio_python, trio_script, "sync", 0),
            Side("cookbook", cookbook_python, cookbook_script, "sync", 0),
        ]
    # "oldest_first", trio_rl's default policy, is the cookbook 0.6.1 loop's own.
    sides = [
        Side("trio_rl (oldest_first)", trio_python, trio_script, "oldest_first", 1),
        Side("cookbook", cookbook_python, cookbook_script, "async", 1),
    ]
    if args.pace:
        sides.insert(1, Side("trio_rl (pace)", trio_python, trio_script, "pace", 1))
    if args.requeue:
        sides.insert(1, Side("trio_rl (requeue)", trio_python, trio_script, "requeue", 1))
    return sides


def run_one(side: Side, cell: pipeline.Cell) -> dict[str, Any]:
    """Run one side on one cell in a fresh process; raise with its output if anything is off."""
    command = [
        str(side.python), str(side.script), "--mode", side.mode_arg, "--steps", str(cell.steps),
        "--sample-s", str(cell.sample_s), "--train-s", str(cell.train_s),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TINKER_TELEMETRY": "0"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env, check=False)
    except subprocess.TimeoutExpired as error:
        raise SystemExit(
            f"run.py: {side.label} on cell {cell.name!r} ran past {RUN_TIMEOUT_S} s: {' '.join(command)}"
        ) from error
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-25:])
        raise SystemExit(
            f"run.py: {side.label} on cell {cell.name!r} failed (exit {done.returncode}): {' '.join(command)}\n{tail}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    expected_groups = cell.steps * pipeline.GROUPS_PER_STEP
    if result["steps"] != cell.steps or result["trained_groups"] != expected_groups:
        raise SystemExit(
            f"run.py: {side.label} on cell {cell.name!r} trained {result['steps']} steps and "
            f"{result['trained_groups']} groups, expected {cell.steps} and {expected_groups}"
        )
    if result["metrics_rows"] < cell.steps:
        raise SystemExit(f"run.py: {side.label} wrote {result['metrics_rows']} metrics rows for {cell.steps} steps")
    ideal = pipeline.ideal_makespan(result["steps"], side.k, cell.sample_s, cell.train_s)
    result["ratio"] = result["makespan"] / ideal if ideal else None
    result["excess_ms_per_step"] = 1e3 * (result["makespan"] - ideal) / result["steps"]
    result["cpu_us_per_group"] = 1e6 * result["cpu_s"] / result["trained_groups"]
    result["wasted"] = result["samples"] - result["trained_groups"] * pipeline.GROUP_SIZE
    return result


def summary(values: list[float], digits: int) -> str:
    """Median [min-max]."""
    if len(values) == 1:
        return f"{values[0]:,.{digits}f}"
    return f"{statistics.median(values):,.{digits}f} [{min(values):,.{digits}f}-{max(values):,.{digits}f}]"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory = f", {pages / 2**30:.0f} GiB"
    except (ValueError, OSError):
        memory = ""
    return f"{os.cpu_count()} x {cpu}{memory}, {platform.system()} {platform.release()}, CPython {platform.python_version()}"


def work_differences(results: dict[tuple[str, str, str], list[dict[str, Any]]]) -> list[str]:
    """What the two sides' counters disagree on, per mode: calls, tokens per Datum, files written."""
    notes = []
    by_mode: dict[str, dict[str, dict[str, list[dict[str, Any]]]]] = {}
    for (cell, mode, side), runs in results.items():
        by_mode.setdefault(mode, {}).setdefault(side, {})[cell] = runs
    for mode, sides in by_mode.items():
        cookbook = sides.get("cookbook", {})
        for side, cells in sides.items():
            if side == "cookbook" or not cookbook:
                continue
            kinds = sorted({k for runs in [*cells.values(), *cookbook.values()] for k in runs[0]["calls"]})
            for kind in kinds:
                pairs = {
                    cell[0]: (runs[0]["calls"].get(kind, 0), cookbook[cell][0]["calls"].get(kind, 0))
                    for cell, runs in cells.items()
                }
                if any(ours != theirs for ours, theirs in pairs.values()):
                    per_cell = ", ".join(f"{c} {ours}/{theirs}" for c, (ours, theirs) in pairs.items())
                    notes.append(f"{mode}: {kind} calls ({side} / cookbook): {per_cell}")
            for label, side_cells in ((side, cells), ("cookbook", cookbook)):
                datums = sum(r["trained_datums"] for runs in side_cells.values() for r in runs)
                tokens = sum(r["trained_tokens"] for runs in side_cells.values() for r in runs)
                steps = sum(runs[0]["steps"] for runs in side_cells.values())
                sizes: dict[str, int] = {}
                for runs in side_cells.values():
                    for name, size in runs[0]["files"].items():
                        sizes[name] = sizes.get(name, 0) + size
                files = ", ".join(f"{name} {size / steps:,.0f}" for name, size in sizes.items())
                notes.append(
                    f"{mode}: {label}: {tokens / datums:.3f} tokens per Datum; bytes written per step: {files}"
                )
    return notes


def run_longtail_one(side: Side, steps: int, draw: int) -> dict[str, Any]:
    """One long-tail run of one side in a fresh process; raise with its output if it fails or loses groups."""
    command = [
        str(side.python), str(side.script), "--longtail", "--mode", side.mode_arg,
        "--k", str(side.k), "--steps", str(steps), "--draw", str(draw),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TINKER_TELEMETRY": "0"}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=LONGTAIL_RUN_TIMEOUT_S, env=env, check=False
        )
    except subprocess.TimeoutExpired as error:
        raise SystemExit(f"run.py: {side.label} ran past {LONGTAIL_RUN_TIMEOUT_S} s: {' '.join(command)}") from error
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-25:])
        raise SystemExit(f"run.py: {side.label} failed (exit {done.returncode}): {' '.join(command)}\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    expected = steps * longtail_workload.GROUPS_PER_STEP
    # requeue drops groups by design; every other loop must train them all.
    if result["trained_groups"] != expected and "requeue" not in side.label:
        raise SystemExit(f"run.py: {side.label} trained {result['trained_groups']} groups, expected {expected}")
    result["limit"] = longtail_workload.sampler_bound_limit(steps, sum(longtail_workload.workload_lengths(steps, draw)))
    return result


def longtail_cell(args: argparse.Namespace, reps: int) -> None:
    """The long-tail cell: every trio_rl async policy against the cookbook's async loop, K by K."""
    ks = [int(k) for k in args.ks.split(",") if k.strip()]
    policies = longtail.async_policies() if args.policies is None else args.policies.split(",")
    trio_python, cookbook_python = Path(args.trio_python), Path(args.cookbook_python)
    print(f"machine: {machine()}")
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True, check=False).stdout.strip()}")
    lengths = longtail_workload.workload_lengths(args.steps, args.draw)
    limit = longtail_workload.sampler_bound_limit(args.steps, sum(lengths))
    print(
        f"long-tail cell: {args.steps} steps, draw {args.draw}: {sum(lengths):,} tokens, limit {limit:.1f} s; K = {ks}; {reps} repetitions"
    )
    started = time.monotonic()
    loads: list[float] = []
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for rep in range(reps):
        for k in ks:
            sides = [Side(f"trio_rl ({p})", trio_python, HERE / "trio_side.py", p, k) for p in policies]
            sides.append(Side("cookbook", cookbook_python, HERE / "cookbook_side.py", "async", k))
            if rep % 2:
                sides.reverse()
            for side in sides:
                loads.append(os.getloadavg()[0])
                result = run_longtail_one(side, args.steps, args.draw)
                results.setdefault((k, side.label), []).append(result)
                print(
                    f"  rep {rep + 1}/{reps} K={k} {side.label:<18} makespan {result['makespan']:7.2f} s  "
                    f"trained {result['trained_groups']:>4}  staleness {result['staleness_mean']:.2f}  "
                    f"lag {result['token_lag_mean']:.2f}  util {result['sampler_utilisation']:.2f}",
                    flush=True,
                )
    print()
    print(
        f"{time.monotonic() - started:.0f} s in all; 1-minute load during the runs: {min(loads):.2f}-{max(loads):.2f}"
    )
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True, check=False).stdout.strip()}")
    print()
    print(
        "| K | loop | makespan s | / limit | / cookbook | groups trained | staleness mean (max) | token lag mean | sampler util |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for k in ks:
        cookbook = statistics.median(r["makespan"] for r in results[(k, "cookbook")])
        for (rk, label), runs in results.items():
            if rk != k:
                continue
            makespans = [r["makespan"] for r in runs]
            median = statistics.median(makespans)
            print(
                f"| {k} | {label} | {summary(makespans, 1)} | {median / limit:.2f} | {median / cookbook:.2f} | "
                f"{summary([float(r['trained_groups']) for r in runs], 0)} | "
                f"{statistics.median(r['staleness_mean'] for r in runs):.2f} ({max(r['staleness_max'] for r in runs)}) | "
                f"{statistics.median(r['token_lag_mean'] for r in runs):.2f} | "
                f"{statistics.median(r['sampler_utilisation'] for r in runs):.2f} |"
            )
    if args.json is not None:
        rows = [{"k": k, "loop": label, "runs": runs} for (k, label), runs in results.items()]
        document = {"machine": machine(), "steps": args.steps, "draw": args.draw, "reps": reps, "results": rows}
        args.json.write_text(json.dumps(document, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=None, help="repetitions of every run (default 3; 2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="5x fewer steps per cell, 2 repetitions")
    parser.add_argument("--requeue", action="store_true", help="also run trio_rl's async 'requeue' policy")
    parser.add_argument("--pace", action="store_true", help="also run trio_rl's async 'pace' policy")
    parser.add_argument("--cells", default="a,b,c,d", help="which cells, by letter (default a,b,c,d)")
    parser.add_argument("--json", type=Path, help="also write every run's measurements to this file")
    parser.add_argument("--longtail", action="store_true", help="run the long-tail cell instead of cells a-d")
    parser.add_argument(
        "--steps", type=int, default=longtail_workload.STEPS, help="long-tail cell: steps (default 100)"
    )
    parser.add_argument("--ks", default="1,2,4", help="long-tail cell: K values (default 1,2,4)")
    parser.add_argument("--policies", help="long-tail cell: trio_rl async policies (default: every one)")
    parser.add_argument("--draw", type=int, default=0, help="long-tail cell: another set of lengths, same distribution")
    parser.add_argument("--trio-python", default=str(REPO / ".venv/bin/python"))
    parser.add_argument("--cookbook-python", default=str(REPO / ".vs-cookbook-venv/bin/python"))
    args = parser.parse_args()
    reps = args.reps if args.reps is not None else (2 if args.quick else 3)
    if reps < 1:
        parser.error("--reps must be at least 1")
    for python in (args.trio_python, args.cookbook_python):
        if not Path(python).is_file():
            parser.error(f"{python} does not exist; run bench/vs_cookbook/run.sh, which builds both venvs")
    if args.longtail:
        longtail_cell(args, args.reps if args.reps is not None else 1)
        return
    wanted = {c.strip() for c in args.cells.split(",") if c.strip()}
    cells = [c for c in pipeline.CELLS if c.name[0] in wanted]
    if not cells or len(cells) != len(wanted):
        parser.error(f"--cells takes letters among {', '.join(c.name[0] for c in pipeline.CELLS)}")
    if args.quick:
        cells = [pipeline.Cell(c.name, max(2, c.steps // 5), c.sample_s, c.train_s) for c in cells]

    print(f"machine: {machine()}")
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
    started = time.monotonic()
    results: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    loads: list[float] = []
    for rep in range(reps):
        for cell in cells:
            for mode in ("sync", "async K=1"):
                sides = sides_for(mode, args)
                if rep % 2:
                    sides.reverse()
                for side in sides:
                    loads.append(os.getloadavg()[0])
                    result = run_one(side, cell)
                    results.setdefault((cell.name, mode, side.label), []).append(result)
                    ratio = "-" if result["ratio"] is None else f"{result['ratio']:.3f}"
                    print(
                        f"  rep {rep + 1}/{reps} {cell.name:<18} {mode:<9} {side.label:<18} ratio {ratio:>6} "
                        f"CPU {result['cpu_us_per_group']:>6.0f} us/group  excess {result['excess_ms_per_step']:>6.1f} ms/step",
                        flush=True,
                    )
    load_after = os.getloadavg()

    versions = {}
    for (_cell, _mode, label), runs in results.items():
        versions[label.split(" ")[0]] = runs[0]["versions"]
    print()
    print(f"{reps} repetitions, {time.monotonic() - started:.0f} s in all")
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; "
          f"1-minute load during the runs: {min(loads):.2f}-{max(loads):.2f}")  # fmt: skip
    for name, v in sorted(versions.items()):
        print(f"{name}: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    print()
    print("| cell | mode | loop | makespan / ideal | CPU µs per group | excess ms per step | samples wasted |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (cell_name, mode, label), runs in results.items():
        ratios = [r["ratio"] for r in runs if r["ratio"] is not None]
        print(
            f"| {cell_name} | {mode} | {label} | {summary(ratios, 3) if ratios else '-'} | "
            f"{summary([r['cpu_us_per_group'] for r in runs], 0)} | "
            f"{summary([r['excess_ms_per_step'] for r in runs], 1)} | "
            f"{summary([float(r['wasted']) for r in runs], 0)} |"
        )
    print()
    print("Differences in work between the two sides (their fakes' counters; tokens per Datum follow")
    print("the same rule on both, from different random draws):")
    for note in work_differences(results):
        print(f"- {note}")
    if args.json is not None:
        rows = [{"cell": c, "mode": m, "loop": s, "runs": runs} for (c, m, s), runs in results.items()]
        args.json.write_text(json.dumps({"machine": machine(), "reps": reps, "results": rows}, indent=1))


if __name__ == "__main__":
    main()
