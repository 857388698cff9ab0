"""Every trio_rl mode on the long-tail workload, in virtual time, against the sampler-bound limit.

Run: ``.venv/bin/python bench/longtail.py`` (10-25 s per row on a loaded 2-core machine;
``--steps 20`` for a short run, ``--ks 1,2`` or ``--policies pace`` for fewer rows,
``--json FILE`` to keep every row's numbers).

The workload (``bench/longtail_workload.py``, issue 20): steps of 8 groups x 8
samples; lognormal response lengths (median 200 tokens, sigma 1, capped at
4,096), each fixed by its prompt's first three tokens and its sample index; a
sampler that runs 128 sequences at once at 0.5 ms per token
(:class:`~trio_rl.testing.FakeBackend`'s sampler model); ``forward_backward``
0.1 s; nothing else takes time. Everything runs under
``trio.testing.MockClock(autojump_threshold=0)``, so the numbers are the
schedule's own, free of CPU cost, and the same on every machine.

Rows: sync, then every async policy that ``AsyncConfig`` admits (read from its
``staleness`` field's type, so a new policy shows up here without a change) at
each K, then each policy that admits in-flight weights with them
(``oldest_first+inflight``: ``AsyncConfig(..., inflight_weights=True)``). Columns:

- makespan: virtual seconds of ``train()``;
- limit: ``max(total tokens x 0.5 ms / 128, steps x 0.1 s) + 0.1 s``;
- ratio: makespan / limit;
- util: sampler utilisation, slot-seconds held (wasted work included) / (128 x makespan);
- staleness: of each trained group, the training step minus the weights version
  it sampled from; mean and max over trained groups;
- trained / requeued / dropped: groups (requeued: ``run/requeued``, the groups resampled);
- lag mean, lag max: the lag of each trained token, the training step minus the
  version that produced it, token-weighted mean and max; with snapshot weights
  every token of a group has the group's staleness, in flight each token has
  the version the fake sampler recorded for it (``FakeSequence.token_versions``).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import sys
import tempfile
import time
import typing
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import trio
import trio.testing

from trio_rl import AsyncConfig, Config, train
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec, FakeSamplerModel, FakeSequence

# Run as a script, this file puts the repository root on the path, so its neighbours import as bench.x,
# the one name the tests and the type checker give them too.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import longtail_workload as workload

KS = (1, 2, 4, 8)

INFLIGHT = "+inflight"
"""The suffix of a policy run with in-flight weights."""

INFLIGHT_POLICIES = ("oldest_first",)
"""The policies ``AsyncConfig(..., inflight_weights=True)`` admits."""


def async_policies() -> list[str]:
    """Every value ``AsyncConfig.staleness`` admits, in the order its type lists them, then those run in flight."""
    hints = typing.get_type_hints(AsyncConfig)
    snapshot = [str(value) for value in typing.get_args(hints["staleness"])]
    return snapshot + [p + INFLIGHT for p in snapshot if p in INFLIGHT_POLICIES]


def modes(ks: list[int], policies: list[str]) -> dict[str, dict[str, Any]]:
    """Row label -> the ``Config`` fields that select it."""
    rows: dict[str, dict[str, Any]] = {"sync": {}}
    for policy in policies:
        staleness, inflight = policy.removesuffix(INFLIGHT), policy.endswith(INFLIGHT)
        for k in ks:
            async_config = AsyncConfig(k, workload.GROUPS_PER_STEP, staleness, inflight_weights=inflight)  # type: ignore[arg-type]
            rows[f"{policy} K={k}"] = {"async_config": async_config}
    return rows


def make_backend(draw: int = 0, record_calls: bool = True) -> FakeBackend:
    """The workload's sampler and trainer."""
    return FakeBackend(
        train_latency=workload.TRAIN_S,
        record_calls=record_calls,
        sampler=FakeSamplerModel(
            slots=workload.SAMPLE_SLOTS,
            token_latency=workload.TOKEN_LATENCY_S,
            response_length=functools.partial(workload.response_length, draw=draw),
        ),
    )


def trained_attempts(backend: FakeBackend) -> list[tuple[int, list[FakeSequence]]]:
    """For each trained group: its training step and the sequences of the attempt that was trained.

    A resampled group is trained from its latest attempt that had
    completed by its ``forward_backward``: a new attempt starts only once the
    previous one has been given up.
    """
    by_group: dict[tuple[int, int], list[FakeSequence]] = defaultdict(list)
    for sequence in backend.sequences:
        if not sequence.cancelled:
            by_group[(sequence.prompt[0] - 1, sequence.prompt[1] - 2)].append(sequence)
    out = []
    for call in backend.calls_of("forward_backward"):
        for key in call.detail["groups"]:
            done = [s for s in by_group[tuple(key)] if s.ended <= call.time]
            attempt = sorted(done, key=lambda s: (s.started, s.prompt))[-workload.GROUP_SIZE :]
            out.append((call.version, attempt))
    return out


def token_lags(step: int, attempt: list[FakeSequence]) -> list[tuple[int, int]]:
    """(lag, tokens) of a trained attempt, from each token's own version where the sampler recorded one.

    With snapshot weights all of a sequence's tokens share its group's staleness.
    """
    lags: list[tuple[int, int]] = []
    for s in attempt:
        if s.token_versions is None:
            lags.append((step - s.version, s.length))
        else:
            lags.extend((step - version, n) for version, n in Counter(s.token_versions).items())
    return lags


async def run_mode(mode: dict[str, Any], steps: int, draw: int, log_path: Path) -> dict[str, Any]:
    backend = make_backend(draw)
    dataset = FakeDataset(steps, workload.GROUPS_PER_STEP, FakeEnvSpec(group_size=workload.GROUP_SIZE))
    config = Config(
        log_path=log_path, eval_every=0, save_every=0, max_tokens=workload.MAX_TOKENS, learning_rate=1e-4, **mode
    )
    started = trio.current_time()
    async with backend:
        result = await train(config, dataset=dataset, backend=backend)
    makespan = trio.current_time() - started

    total_tokens = sum(workload.workload_lengths(steps, draw))
    limit = workload.sampler_bound_limit(steps, total_tokens)
    busy = sum(s.ended - s.started for s in backend.sequences)
    attempts = trained_attempts(backend)
    staleness = [step - attempt[0].version for step, attempt in attempts]
    lags = [pair for step, attempt in attempts for pair in token_lags(step, attempt)]
    summary = result.summary
    return {
        "steps": result.final_step,
        "makespan_s": makespan,
        "limit_s": limit,
        "ratio": makespan / limit,
        "sampler_utilisation": busy / (workload.SAMPLE_SLOTS * makespan),
        "staleness_mean": sum(staleness) / len(staleness),
        "staleness_max": max(staleness),
        "trained_groups": result.trained_groups,
        "requeued_groups": summary.get("run/requeued"),
        "dropped_groups": result.dropped_groups,
        "token_lag_mean": sum(lag * n for lag, n in lags) / max(1, sum(n for _, n in lags)),
        "token_lag_max": max(lag for lag, _ in lags),
        "workload_tokens": total_tokens,
        "sampled_tokens": sum(s.length for s in backend.sequences if not s.cancelled),
        "cancelled_sequences": sum(1 for s in backend.sequences if s.cancelled),
    }


def run_row(mode: dict[str, Any], steps: int, draw: int = 0) -> dict[str, Any]:
    """One mode's row, run in virtual time."""
    with tempfile.TemporaryDirectory() as tmp:
        return trio.run(run_mode, mode, steps, draw, Path(tmp), clock=trio.testing.MockClock(autojump_threshold=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=workload.STEPS, help=f"steps (default {workload.STEPS})")
    parser.add_argument("--ks", default=",".join(map(str, KS)), help="K values of the async rows (default 1,2,4,8)")
    parser.add_argument(
        "--policies", default=None, help="async policies to run (default: every one AsyncConfig admits)"
    )
    parser.add_argument("--draw", type=int, default=0, help="another set of lengths from the same distribution")
    parser.add_argument("--no-sync", action="store_true", help="leave out the sync row")
    parser.add_argument("--json", type=Path, help="also write every row to this file")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",") if k.strip()]
    known = async_policies()
    policies = known if args.policies is None else [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = sorted(set(policies) - set(known))
    if unknown:
        parser.error(f"unknown policy {unknown[0]!r}; AsyncConfig admits {', '.join(known)}")
    rows = modes(ks, policies)
    if args.no_sync:
        rows.pop("sync")

    lengths = workload.workload_lengths(args.steps, args.draw)
    print(
        f"long-tail workload: {args.steps} steps x {workload.GROUPS_PER_STEP} groups x {workload.GROUP_SIZE} samples, "
        f"draw {args.draw}: {sum(lengths):,} tokens (longest {max(lengths)}), {workload.SAMPLE_SLOTS} slots x "
        f"{workload.TOKEN_LATENCY_S * 1e3:g} ms/token, forward_backward {workload.TRAIN_S} s; virtual time"
    )
    print(f"python {platform.python_version()}, trio {trio.__version__}; {time.strftime('%Y-%m-%d %H:%M %Z')}")
    wait = workload.group_wait_s(args.steps, args.draw)
    limit = workload.sampler_bound_limit(args.steps, sum(lengths))
    print(
        f"token lag floor: a token waits {wait:.3f} s (token-weighted) for its group's longest answer, "
        f"{wait * args.steps / (1.2 * limit):.2f} steps at 1.2x the limit ({limit:.1f} s)"
    )
    header = (
        f"{'mode':<25} {'makespan s':>10} {'limit s':>8} {'ratio':>6} {'util':>5} {'stale mean':>10} "
        f"{'stale max':>9} {'trained':>7} {'requeued':>8} {'dropped':>7} {'lag mean':>8} {'lag max':>7} {'wall s':>6}"
    )
    print(header)
    results = []
    for label, mode in rows.items():
        wall = time.perf_counter()
        row = run_row(mode, args.steps, args.draw)
        row["wall_s"] = time.perf_counter() - wall
        row["mode"] = label
        results.append(row)
        requeued = "-" if row["requeued_groups"] is None else f"{row['requeued_groups']}"
        print(
            f"{label:<25} {row['makespan_s']:>10.1f} {row['limit_s']:>8.1f} {row['ratio']:>6.2f} "
            f"{row['sampler_utilisation']:>5.2f} {row['staleness_mean']:>10.2f} {row['staleness_max']:>9} "
            f"{row['trained_groups']:>7} {requeued:>8} {row['dropped_groups']:>7} {row['token_lag_mean']:>8.2f} "
            f"{row['token_lag_max']:>7} {row['wall_s']:>6.0f}",
            flush=True,
        )
    if args.json is not None:
        workload_fields = {k: v for k, v in vars(workload).items() if k.isupper()}
        document = {"workload": workload_fields, "steps": args.steps, "draw": args.draw, "rows": results}
        args.json.write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
