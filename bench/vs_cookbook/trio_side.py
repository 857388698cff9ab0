"""The trio_rl side: one cell of ``bench/pipeline.py`` in one mode, as a JSON line.

Runs in the repository's ``.venv``. The run itself is ``bench/pipeline.py``'s
``run_cell`` (``trio_rl.train`` on ``FakeBackend`` and ``FakeDataset``, metrics.jsonl
written); this driver only adds counters on the fake training client, so the runner
can compare the work both sides did (calls, Datums, tokens).

With ``--longtail`` it runs ``bench/longtail.py``'s workload instead, in real time:
``longtail.run_mode`` under Trio's real clock, any mode that script knows
(``--mode sync``, or an async policy with ``--k``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tinker
import trio

# bench/pipeline.py: the cells and run_cell (the repository root on the path, as in bench/longtail.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench import longtail, pipeline
from trio_rl.testing import FakeTrainingClient

MODE_NAMES = {
    "sync": "sync",
    "requeue": "async K=1 requeue",
    "pace": "async K=1 pace",
    "oldest_first": "async K=1 oldest_first",
}


@contextlib.contextmanager
def counting_training_calls(counts: Counter[str]) -> Iterator[None]:
    """Count the fake training client's calls, and the Datums and tokens it trains on."""
    originals = {
        name: getattr(FakeTrainingClient, name)
        for name in ("forward_backward", "optim_step", "save_weights_for_sampler", "save_state")
    }

    def wrap(name: str, original: Any) -> Any:
        async def counted(self: FakeTrainingClient, *args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            if name == "forward_backward":
                data = args[0] if args else kwargs["data"]
                counts["datums"] += len(data)
                counts["tokens"] += sum(d.model_input.length for d in data)
            return await original(self, *args, **kwargs)

        return counted

    for name, original in originals.items():
        setattr(FakeTrainingClient, name, wrap(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(FakeTrainingClient, name, original)


def run_longtail(mode_name: str, k: int, steps: int, draw: int = 0) -> dict[str, Any]:
    """One long-tail run in real time: ``bench/longtail.py``'s measures, as this driver reports them."""
    mode = longtail.modes([k], longtail.async_policies())[mode_name if mode_name == "sync" else f"{mode_name} K={k}"]
    cpu = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        row = trio.run(longtail.run_mode, mode, steps, draw, Path(tmp))
    row["makespan"] = row.pop("makespan_s")
    return {
        "side": "trio_rl",
        **row,
        "cpu_s": time.process_time() - cpu,
        "versions": {"tinker": tinker.__version__, "trio": trio.__version__, "python": sys.version.split()[0]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mode", required=True, help=f"{', '.join(sorted(MODE_NAMES))} (or, with --longtail, any async policy)"
    )
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--sample-s", type=float, help="seconds per sample call (required without --longtail)")
    parser.add_argument("--train-s", type=float, help="seconds per forward_backward (required without --longtail)")
    parser.add_argument("--longtail", action="store_true", help="the long-tail workload (bench/longtail.py)")
    parser.add_argument("--k", type=int, default=1, help="max_steps_off_policy of an async --longtail run")
    parser.add_argument("--draw", type=int, default=0, help="--longtail: another set of lengths, same distribution")
    args = parser.parse_args()
    if args.longtail:
        if args.mode != "sync" and args.mode not in longtail.async_policies():
            parser.error(f"--mode {args.mode!r}: use sync or one of {', '.join(longtail.async_policies())}")
        print(json.dumps(run_longtail(args.mode, args.k, args.steps, args.draw)))
        return
    if args.mode not in MODE_NAMES or args.sample_s is None or args.train_s is None:
        parser.error(f"use --mode {'/'.join(sorted(MODE_NAMES))} with --sample-s and --train-s, or --longtail")
    cell = pipeline.Cell("vs_cookbook", args.steps, args.sample_s, args.train_s)
    mode = pipeline.MODES[MODE_NAMES[args.mode]]
    counts: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp, counting_training_calls(counts):
        row = trio.run(pipeline.run_cell, cell, mode, Path(tmp))
        metrics_rows = sum(1 for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines() if line.strip())
        files = {p.name: p.stat().st_size for p in sorted(Path(tmp).iterdir()) if p.is_file()}
    datums, tokens = counts.pop("datums", 0), counts.pop("tokens", 0)
    if datums % pipeline.GROUP_SIZE:
        raise RuntimeError(f"trained {datums} datums, not a multiple of {pipeline.GROUP_SIZE}")
    trained_groups = datums // pipeline.GROUP_SIZE
    samples = int(row["wasted"]) + trained_groups * pipeline.GROUP_SIZE
    calls = {"sample": samples, **counts}
    print(
        json.dumps(
            {
                "side": "trio_rl",
                "steps": int(row["steps"]),
                "makespan": row["makespan"],
                "cpu_s": row["cpu_us_per_group"] * max(1, trained_groups) / 1e6,
                "trained_groups": trained_groups,
                "samples": samples,
                "trained_datums": datums,
                "trained_tokens": tokens,
                "calls": calls,
                "metrics_rows": metrics_rows,
                "files": files,
                "versions": {"tinker": tinker.__version__, "trio": trio.__version__, "python": sys.version.split()[0]},
            }
        )
    )


if __name__ == "__main__":
    main()
