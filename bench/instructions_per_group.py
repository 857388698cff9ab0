"""CPU work per group in instructions, which load on the machine does not change.

Run: ``.venv/bin/python bench/instructions_per_group.py [--mode sync|requeue|pace|oldest_first] [--trace] [--seeds N]``
(needs valgrind; ``apt-get install valgrind``).

Runs bench/pipeline.py's zero-latency cell twice under ``valgrind --tool=callgrind``,
with ``--small`` and ``--large`` steps, and divides the difference in instructions
by the difference in groups: start-up and imports cancel out. Wall-clock CPU time
on a shared machine moves by 10-30% between runs; this count moves much less, so it
shows whether a change to the per-group path helps.

What the count still moves with is the order in which Trio runs each batch of
ready tasks, which it shuffles with a generator of its own: in the async modes,
which tasks share a scheduler pass, and so how many passes a group costs,
follows that order. (Same order, same count: two runs of a 10-step cell under
one seed agreed to 0.02%; under different seeds they differed by 0.3% of the
whole run.) So each count runs under a seeded order (``--seeds N``: seeds 0 to
N-1, each with its ``--small`` and ``--large`` run), and the script prints the
mean over the seeds with the lowest and the highest, its spread beside it. The
seed is set where ``tests/conftest.py``'s ``trio_task_order_from_seed`` sets it,
and the script stops if Trio has moved it.

A seed does not make the count repeatable to the digit: the figure per group is a
difference of two whole runs, so a variation of a fraction of a percent in either
reads as a few percent here. One commit's ``oldest_first`` under seed 0, counted
nine times on one machine and one day, ranged over about 4.7% whether the machine
was busy or idle, with ``PYTHONHASHSEED`` fixed, with OpenBLAS on one thread, and
with the stall watch (a real-time deadline) off; what still varies is not known.
So compare two commits by the mean of several seeds, running them alternately or
side by side, and read a difference of a percent or two as within the noise.

The cell runs under the loop's own garbage-collector policy, as the command
line runs a training run (:func:`trio_rl.loop.gc_policy.tune_gc_for_training`:
what was alive after the imports is frozen out of the collector's scans, and
collections are rarer). Under CPython's default policy each full collection
rescans every import-time object, so the count moved with whatever a change
imported and with where a full collection fell, by a few percent, rather than
with the work per group.

Every mode trains the same loss, ``importance_sampling`` (bench/pipeline.py's
``LOSS_FN``), set explicitly in the async cells: async runs otherwise train
``AsyncConfig.loss_fn``, whose default became tinker-cookbook 0.6.1's
``stable_reinforce``, whose datums carry more per-token inputs. A count that
changed with the default loss would measure the loss, not the loop, and would
not compare with the counts taken when every mode trained ``importance_sampling``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.x, as in bench/longtail.py
from bench import pipeline as bench

RUN_CELL = """
import importlib, random, sys, tempfile
from pathlib import Path
sys.path.insert(0, {bench_dir!r})
import trio
import pipeline as bench
scheduler = importlib.import_module("trio._core._run")
if not isinstance(getattr(scheduler, "_r", None), random.Random):
    raise RuntimeError("trio._core._run._r is not a random.Random: Trio's scheduler moved its generator")
scheduler._r = random.Random({seed})
from trio_rl.loop.gc_policy import tune_gc_for_training
tune_gc_for_training()
cell = bench.Cell("a", {steps}, 0.0, 0.0)
with tempfile.TemporaryDirectory() as tmp:
    trio.run(bench.run_cell, cell, {{**bench.MODES[{mode!r}], **{extra!r}}}, Path(tmp))
"""


def _cell_code(steps: int, mode: str, extra: dict[str, object] | None, seed: int = 0) -> str:
    bench_dir = str(Path(__file__).resolve().parent)
    return RUN_CELL.format(bench_dir=bench_dir, steps=steps, mode=mode, extra=extra or {}, seed=seed)


def warm_up(mode: str, extra: dict[str, object] | None = None) -> None:
    """Run the cell once, unmeasured, so that every module it imports has its bytecode cached.

    A module whose cached bytecode is missing or stale (a fresh worktree, a file
    just edited) is compiled by the first run that imports it. Without this, that
    is the ``--small`` run and not the ``--large`` one, the compile's instructions
    come off the difference, and the count per group reads low, by as much as a
    few percent, depending on what the checkout had cached.
    """
    subprocess.run([sys.executable, "-c", _cell_code(2, mode, extra)], capture_output=True, check=True)


def instructions(steps: int, mode: str, extra: dict[str, object] | None = None, seed: int = 0) -> int:
    """Instructions of one run of the cell under Trio's task order from ``seed``, with ``extra`` Config fields (such as ``trace``) set."""
    code = _cell_code(steps, mode, extra, seed)
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    match = re.search(r"Collected : (\d+)", done.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["sync", "requeue", "pace", "oldest_first"], default="requeue")
    parser.add_argument("--small", type=int, default=10)
    parser.add_argument("--large", type=int, default=40)
    parser.add_argument("--trace", action="store_true", help="with Config.trace on (the trace file and time/* metrics)")
    parser.add_argument("--seeds", type=int, default=3, help="Trio task orders to count under (seeds 0 to N-1)")
    args = parser.parse_args()
    mode = "sync" if args.mode == "sync" else f"async K=1 {args.mode}"
    extra: dict[str, object] = {"trace": True} if args.trace else {}
    warm_up(mode, extra)
    groups = (args.large - args.small) * bench.GROUPS_PER_STEP
    per_group = []
    for seed in range(args.seeds):
        small, large = instructions(args.small, mode, extra, seed), instructions(args.large, mode, extra, seed)
        per_group.append((large - small) / groups / 1e6)
    label = f"{args.mode}{', trace on' if args.trace else ''}"
    spread = f"; lowest {min(per_group):.3f}, highest {max(per_group):.3f}" if len(per_group) > 1 else ""
    print(
        f"{label}: {sum(per_group) / len(per_group):.3f} M instructions per group "
        f"({groups} groups, mean over {len(per_group)} task-order seeds{spread})"
    )


if __name__ == "__main__":
    main()
