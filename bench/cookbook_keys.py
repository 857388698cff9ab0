"""The metric keys trio_rl writes against tinker-cookbook 0.6.1's, concept by concept.

Run: ``.venv/bin/python bench/cookbook_keys.py``. It trains a short sync run and
a short async run on fakes (3 batches of 2 groups, one logging tag covering
every group, a test-set evaluator on every step), collects every key of their
``metrics.jsonl``, and compares them with the keys the cookbook wrote on the
same kind of run (``cookbook_0_6_1_metric_keys.json``, measured with fake
clients and the cookbook's ArithmeticDataset). Each cookbook key falls in one of:

- shared: trio_rl writes it too;
- env-defined: a metric the env itself reports (the cookbook's arithmetic env
  reports ``correct``/``format``, the fake env ``even_frac``/``group_size``);
- not measured: a concept trio_rl does not measure (see ``NOT_MEASURED``);
- missing: a concept trio_rl measures under another key, or could compute.

``tests/test_cookbook_metric_keys.py`` asserts that nothing is missing on fakes;
``tests/cookbook/test_cookbook_semantics.py`` (the tinker-cookbook suite, run by
``tests/cookbook/run.sh``) does so on the cookbook's own ArithmeticDataset and
RLTestSetEvaluator, where the env-defined keys are shared too.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

import trio

from trio_rl import AsyncConfig, Config, RLTestSetEvaluator, train
from trio_rl.testing import FakeBackend, FakeDataset

COOKBOOK_KEYS = Path(__file__).with_name("cookbook_0_6_1_metric_keys.json")

TRAJECTORY_KEYS = {
    "reward/total", "total_episodes", "total_turns", "turns_per_episode", "total_ac_tokens", "total_ob_tokens",
    "ac_tokens_per_turn", "ob_tokens_per_turn", "by_group/frac_mixed", "by_group/frac_all_good",
    "by_group/frac_all_bad", "total_cached_ob_tokens",
}  # fmt: skip
"""What ``env/<tag>/...`` holds besides the env's own metrics."""

NOT_MEASURED: dict[str, str] = {
    r"^time/sampling_time_(min|max|mean)$": "each group's sampling wall time in the cookbook's async loop; "
    "trio_rl does not time groups one by one",
    r"^time/(?!train_step$|run_evals$|total$)": "a trace span of one of the cookbook's own loop functions; "
    "trio_rl times the training step (time/train_step), evaluations (time/run_evals) and the run (time/total)",
    r"(^|/)env/all/total_cached_ob_tokens$": "prefix-cache hits: no trio_rl backend reports them",
    r"^eval/": "the cookbook's bookkeeping of evaluations running beside async training (by_step/by_time "
    "snapshots); trio_rl writes each evaluation under the step whose weights it scored",
}
"""Cookbook keys of concepts trio_rl does not measure, with the reason."""

RENAMED_AWAY = {"sampling_client/staleness_max", "time/train", "time/eval"}
"""trio_rl's former names of concepts the cookbook names otherwise."""


def env_defined(key: str) -> bool:
    """Whether ``key`` is a metric an env reports for itself (``env/<tag>/<its key>``)."""
    match = re.match(r"^(?:test/)?env/[^/]+/(.+)$", key)
    return match is not None and match.group(1) not in TRAJECTORY_KEYS


def not_measured(key: str) -> str | None:
    """Why trio_rl does not write ``key``, if it is a concept trio_rl does not measure."""
    return next((why for pattern, why in NOT_MEASURED.items() if re.search(pattern, key)), None)


async def trio_rl_keys(mode: str) -> set[str]:
    """Every key of ``metrics.jsonl`` for a short run on fakes in ``mode`` ("sync" or "async")."""
    extra: dict[str, Any] = (
        {"async_config": AsyncConfig(max_steps_off_policy=1, groups_per_batch=2)} if mode == "async" else {}
    )
    with tempfile.TemporaryDirectory() as folder:
        config = Config(log_path=folder, eval_every=1, save_every=0, **extra)
        dataset = FakeDataset(3, 2, tags=lambda b, g: ("problems",))
        evaluator = RLTestSetEvaluator(FakeDataset(1, 2, tags=lambda b, g: ("problems",)), max_tokens=8)
        async with FakeBackend() as backend:
            await train(config, dataset=dataset, backend=backend, evaluators=(evaluator,))  # type: ignore[arg-type, unused-ignore]  # needed or not by the environment
        keys: set[str] = set()
        for line in (Path(folder) / "metrics.jsonl").read_text().splitlines():
            keys |= set(json.loads(line))
        return keys


def compare(cookbook: set[str], ours: set[str]) -> dict[str, list[str]]:
    """The cookbook's keys by category, and trio_rl's own extras."""
    out: dict[str, list[str]] = {"shared": [], "env-defined": [], "not measured": [], "missing": [], "trio_rl only": []}
    for key in sorted(cookbook):
        if key in ours:
            out["shared"].append(key)
        elif env_defined(key):
            out["env-defined"].append(key)
        elif not_measured(key):
            out["not measured"].append(key)
        else:
            out["missing"].append(key)
    out["trio_rl only"] = sorted(k for k in ours - cookbook if not env_defined(k))
    return out


def main() -> None:
    cookbook = json.loads(COOKBOOK_KEYS.read_text())
    for mode in ("sync", "async"):
        ours = trio.run(trio_rl_keys, mode)
        result = compare(set(cookbook[mode]), ours)
        print(f"## {mode}: cookbook {len(cookbook[mode])} keys, trio_rl {len(ours)} keys")
        for category, keys in result.items():
            print(f"- {category} ({len(keys)}): {', '.join(keys) if keys else '-'}")
        reasons = sorted({why for key in result["not measured"] if (why := not_measured(key))})
        for why in reasons:
            print(f"  not measured because: {why}")
        print()


if __name__ == "__main__":
    main()
