"""Overlap headroom: what running sampling and training at once could save per step, on this machine.

    python bench/overlap_headroom.py run --out runs/overlap/results.jsonl
    python bench/overlap_headroom.py report --results runs/overlap/results.jsonl

Not a test. An async step overlaps the sampling of the next batch with the
training on this one; a sync step does one after the other. This times, on
LocalBackend with ``bench/time_to_reward.py``'s model and batch (the
``examples/repeat_letters.py`` task, 8 groups x 8 samples, ``max_tokens=24``):

* ``sample``: one step's sampling alone (64 rollouts, 8 prompts at once);
* ``train``: one step's training alone: ``forward_backward`` (token TIS, the
  async default) and ``optim_step`` on those 64 rollouts, then
  ``save_weights_for_sampler``, which every step of both loops ends with;
* ``both``: the two at once, as the async loop runs them (the sampler on
  pinned weights, the trainer on the previous batch), until both are done.

From them, per repetition: sync's step ``sample + train``, a perfect overlap's
``max(sample, train)``, and the measured overlap ``both``. The same rollouts
each time (seeded sampling from weights that never change), so every
repetition does the same work.

Settings (``--settings``), each ``THREADSxJOBS``: ``THREADS`` is
``LocalBackend(num_threads=...)`` (torch's intra-op threads, process-wide;
LocalBackend's default is 1) and ``JOBS`` how many torch jobs the backend
runs at once. LocalBackend runs one (``BackendRuntime.limiter``, a
``trio.CapacityLimiter(1)``: a decode step and a training step never run at
the same time); ``JOBS=2`` replaces that limiter, here only, to see whether
two single-threaded jobs on two threads would overlap on these cores.

The settings take turns: ``--rounds`` rounds, each visiting every setting (in
an order that rotates with the round) for ``--reps`` repetitions, and each
repetition times the three measures in an order that rotates too, so a change
in the machine's load falls on all of them. Each measure appends one JSON line
to ``--out`` with ``os.getloadavg()``, torch's thread settings, and the
process's CPU seconds over it (``time.process_time``, every thread): CPU over
wall-clock is how many cores the process got, which tells waiting for a core
(another process's load, or the GIL) from work. Before each ``both``, a probe
times fixed torch work on one thread and twice it on two threads at once: how
many cores two threads could get at that moment.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from statistics import median
from typing import Any

import torch
import trio
from tinker import types as tinker_types

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

from bench.time_to_reward import MODEL  # noqa: E402
from trio_rl import _tinker_compat  # noqa: E402
from trio_rl.backends.local import CharTokenizer, LocalBackend  # noqa: E402
from trio_rl.backends.local.sampler import LocalSamplingClient  # noqa: E402
from trio_rl.backends.local.training import LocalTrainingClient  # noqa: E402
from trio_rl.cli import LazyTokenizer, parse_args  # noqa: E402

GROUPS = 8
GROUP_SIZE = 8
MAX_TOKENS = 24
LOSS_CONFIG = {"tis_cap": 2.0}
MEASURES = ("sample", "train", "both")

Prompt = tuple[tinker_types.ModelInput, list[int]]


def _prompts() -> list[Prompt]:
    """Batch 0 of the sweep's dataset (seed 0): 8 prompts with counts drawn as the example draws them."""
    repeat = importlib.import_module("repeat_letters")
    tokenizer = CharTokenizer(repeat.ALPHABET)
    args = parse_args(repeat.Args, [], groups_per_batch=GROUPS, group_size=GROUP_SIZE, progress=False)
    renderer = repeat.Renderer(LazyTokenizer(tokenizer))
    builders = repeat.RepeatDataset(args, renderer, num_batches=1).get_batch(0)
    return [renderer.prompt(b.letter, b.count) for b in builders]


async def _sample(sampler: LocalSamplingClient, prompts: Sequence[Prompt]) -> list[tinker_types.SampleResponse]:
    responses: list[tinker_types.SampleResponse | None] = [None] * len(prompts)

    async def one(i: int) -> None:
        ob, stop = prompts[i]
        params = tinker_types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, stop=stop, seed=i)
        responses[i] = await sampler.sample(ob, GROUP_SIZE, params)

    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(one, i)
    return [r for r in responses if r is not None]


def _datums(prompts: Sequence[Prompt], responses: Sequence[tinker_types.SampleResponse]) -> list[tinker_types.Datum]:
    """The rollouts as the loop assembles them for importance sampling (advantages of +-1: timing only)."""
    data = []
    for (ob, _), response in zip(prompts, responses, strict=True):
        prompt = ob.to_ints()
        for j, seq in enumerate(response.sequences):
            tokens = list(seq.tokens)
            logprobs = list(seq.logprobs or [0.0] * len(tokens))
            advantage = 1.0 if j % 2 else -1.0
            pad = len(prompt) - 1
            data.append(
                tinker_types.Datum(
                    model_input=tinker_types.ModelInput.from_ints(prompt + tokens[:-1]),
                    loss_fn_inputs={
                        "target_tokens": _tinker_compat.tensor(prompt[1:] + tokens, "int64"),
                        "logprobs": _tinker_compat.tensor([0.0] * pad + logprobs, "float32"),
                        "advantages": _tinker_compat.tensor([0.0] * pad + [advantage] * len(tokens), "float32"),
                    },
                )
            )
    return data


async def _train(trainer: LocalTrainingClient, data: list[tinker_types.Datum], step: int) -> float:
    """One training step; returns the seconds the weights' publication took of it."""
    fb = await trainer.forward_backward(data, "importance_sampling", LOSS_CONFIG)
    optim = await trainer.optim_step(tinker_types.AdamParams(learning_rate=1e-3))
    await fb.result()
    await optim.result()
    published = time.perf_counter()
    await trainer.save_weights_for_sampler(f"step{step}")
    return time.perf_counter() - published


def _probe() -> tuple[float, float]:
    """Seconds of fixed torch work (no Python between ops) on one thread, and of twice it on two threads at once.

    ``2 * one / two`` is how many cores two threads could get just then: what overlap could use at best.
    """
    # One intra-op thread each, whatever the setting: the probe asks what two threads get, not torch's pool.
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    matrix = torch.randn(384, 384)

    def work() -> None:
        for _ in range(20):
            matrix @ matrix

    try:
        start = time.perf_counter()
        work()
        one = time.perf_counter() - start
        threads = [threading.Thread(target=work) for _ in range(2)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return one, time.perf_counter() - start
    finally:
        torch.set_num_threads(saved)


async def _side(ends: dict[str, float], name: str, start: float, work: Awaitable[Any]) -> None:
    """Await one side of ``both``, noting when it finished."""
    await work
    ends[name] = time.perf_counter() - start


async def _block(setting: str, reps: int, round_index: int, out: Path) -> None:
    threads, jobs = (int(part) for part in setting.split("x"))
    prompts = _prompts()
    with tempfile.TemporaryDirectory() as log_dir:
        repeat = importlib.import_module("repeat_letters")
        backend = LocalBackend(
            log_dir=log_dir, model_config=MODEL, tokenizer=CharTokenizer(repeat.ALPHABET), seed=0, num_threads=threads
        )
        async with backend:
            if jobs != 1:
                # Here only: let a decode step and a training step run at once, on two threads.
                backend._runtime.limiter = trio.CapacityLimiter(jobs)
            trainer = await backend.create_training_client(base_model="local", seed=0)
            sampler = await trainer.save_weights_for_sampler("pinned")
            responses = await _sample(sampler, prompts)  # warm-up, and the rollouts to train on
            data = _datums(prompts, responses)
            tokens = sum(len(s.tokens) for r in responses for s in r.sequences)
            step = 0
            await _train(trainer, data, step)  # warm-up
            context = {
                "setting": setting,
                "round": round_index,
                "torch_threads": torch.get_num_threads(),
                "torch_interop_threads": torch.get_num_interop_threads(),
                "jobs": jobs,
                "tokens_sampled": tokens,
                "train_tokens": sum(d.model_input.length for d in data),
            }
            for rep in range(reps):
                order = MEASURES[rep % 3 :] + MEASURES[: rep % 3]
                for measure in order:
                    step += 1
                    line: dict[str, Any] = {**context, "rep": rep, "measure": measure, "load": os.getloadavg()}
                    if measure == "both":
                        line["probe_one_s"], line["probe_two_s"] = _probe()
                    start, cpu_start = time.perf_counter(), time.process_time()
                    if measure == "sample":
                        await _sample(sampler, prompts)
                    elif measure == "train":
                        line["publish_s"] = await _train(trainer, data, step)
                    else:
                        ends: dict[str, float] = {}
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(_side, ends, "sample", start, _sample(sampler, prompts))
                            nursery.start_soon(_side, ends, "train", start, _train(trainer, data, step))
                        line["sample_end_s"], line["train_end_s"] = ends["sample"], ends["train"]
                    line["seconds"] = time.perf_counter() - start
                    # The CPU seconds of every thread of this process: over ``seconds``, how many cores it got.
                    line["cpu_s"] = time.process_time() - cpu_start
                    with out.open("a") as file:
                        file.write(json.dumps(line) + "\n")


def run(options: argparse.Namespace) -> None:
    out = Path(options.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as file:
        machine = {
            "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "trio": trio.__version__,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load": os.getloadavg(),
        }
        file.write(json.dumps({"measure": "machine", **machine}) + "\n")
    settings = options.settings
    for round_index in range(options.rounds):
        shift = round_index % len(settings)
        for setting in settings[shift:] + settings[:shift]:
            trio.run(_block, setting, options.reps, round_index, out)
            print(f"round {round_index} {setting} done, load {os.getloadavg()[0]:.2f}", flush=True)
    print(report(out))


def _cell(values: list[float]) -> str:
    return f"{median(values) * 1000:.0f} [{min(values) * 1000:.0f}-{max(values) * 1000:.0f}]"


def report(results: Path) -> str:
    """Per run of ``run`` in the file, per setting: median [min-max] ms of each measure, sync's and a perfect
    overlap's step, the speed-ups (medians of the per-repetition ratios), and the cores the process got."""
    runs: list[list[dict[str, Any]]] = []
    for text in results.read_text().splitlines():
        line = json.loads(text)
        if line["measure"] == "machine":
            runs.append([line])
        else:
            runs[-1].append(line)
    return "\n\n".join(_run_table(run[0], run[1:]) for run in runs if len(run) > 1)


def _run_table(machine: dict[str, Any], lines: list[dict[str, Any]]) -> str:
    loads = [line["load"][0] for line in lines]
    rows = [
        "| threads x jobs | reps | sample ms | train ms (publish) | both ms | sync = sample + train | "
        "perfect = max | sync / perfect | sync / both | cores used: sample / train / both | cores two threads got |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for setting in dict.fromkeys(line["setting"] for line in lines):
        by: dict[tuple[int, int], dict[str, dict[str, Any]]] = {}
        for line in lines:
            if line["setting"] == setting:
                by.setdefault((line["round"], line["rep"]), {})[line["measure"]] = line
        reps = [r for r in by.values() if all(m in r for m in MEASURES)]
        sample = [r["sample"]["seconds"] for r in reps]
        train = [r["train"]["seconds"] for r in reps]
        both = [r["both"]["seconds"] for r in reps]
        sync = [s + t for s, t in zip(sample, train, strict=True)]
        perfect = [max(s, t) for s, t in zip(sample, train, strict=True)]
        publish = median(r["train"]["publish_s"] for r in reps)
        free = median(2 * r["both"]["probe_one_s"] / r["both"]["probe_two_s"] for r in reps)
        cores = " / ".join(f"{median(r[m]['cpu_s'] / r[m]['seconds'] for r in reps):.2f}" for m in MEASURES)
        rows.append(
            f"| {setting} | {len(reps)} | {_cell(sample)} | {_cell(train)} ({publish * 1000:.0f}) | {_cell(both)} | "
            f"{_cell(sync)} | {_cell(perfect)} | {median(a / b for a, b in zip(sync, perfect, strict=True)):.2f}x | "
            f"{median(a / b for a, b in zip(sync, both, strict=True)):.2f}x | {cores} | {free:.2f} |"
        )
    m = machine
    tokens = sorted({(line["tokens_sampled"], line["train_tokens"]) for line in lines})
    head = [
        f"{m['date']}: {m['machine']}, {m['cpus']} CPUs, Python {m['python']}, torch {m['torch']}",
        f"1-minute load average during the measures: {min(loads):.2f}-{max(loads):.2f}",
        f"tokens sampled per step / tokens trained per step: {tokens}",
    ]
    return "\n".join([*head, "", *rows])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    measure = commands.add_parser("run", help="time the measures of every setting, appending to --out")
    measure.add_argument("--out", required=True)
    measure.add_argument("--settings", nargs="+", default=["1x1", "1x2", "2x1", "2x2"])
    measure.add_argument("--rounds", type=int, default=3)
    measure.add_argument("--reps", type=int, default=4, help="repetitions per setting per round")
    show = commands.add_parser("report", help="the table of a results file")
    show.add_argument("--results", required=True)
    options = parser.parse_args()
    if options.command == "run":
        run(options)
    else:
        print(report(Path(options.results)))


if __name__ == "__main__":
    main()
