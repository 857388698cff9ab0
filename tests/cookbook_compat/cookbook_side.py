"""tinker-cookbook 0.6.1's half of the checkpoint round trip (run in a venv with the cookbook, no trio_rl).

    cookbook_side.py read RUN_DIR     get_last_checkpoint reads a trio_rl run
    cookbook_side.py write RUN_DIR    the cookbook's own save_checkpoint_async writes a row at batch 2
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from tinker_cookbook import checkpoint_utils


def read(folder: str) -> None:
    record = checkpoint_utils.get_last_checkpoint(folder)
    assert record is not None, "get_last_checkpoint found no resumable row"
    assert record.name == "final" and record.final is True, record
    assert record.batch == 4 and record.state_path and record.sampler_path, record
    sampler = checkpoint_utils.get_last_checkpoint(folder, required_key="sampler_path")
    assert sampler is not None and sampler.sampler_path == record.sampler_path
    assert set(record.extra["cumulative_tokens"]) == {"sampled", "prefill_cached", "prefill_uncached", "trained"}
    print(f"cookbook: last checkpoint {record.name} at batch {record.batch}: {record.state_path}")


class _Saved:
    def __init__(self, path: str) -> None:
        self.path = path

    def __await__(self):  # noqa: ANN204 - an awaitable that is already done
        if False:
            yield
        return self


class _Client:
    """Just what save_checkpoint_async calls on a training client."""

    def save_state(self, name: str, ttl_seconds: int | None = None) -> _Saved:
        return _Saved(f"fake://state/{name}")

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None) -> _Saved:
        return _Saved(f"fake://sampler/{name}")


def write(folder: str) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    loop_state = {
        "batch": 2,
        "cumulative_tokens": {"sampled": 10, "prefill_cached": 0, "prefill_uncached": 20, "trained": 30},
        "discarded_tokens": {"sampled": 0, "prefill_cached": 0, "prefill_uncached": 0, "trained": 0},
    }
    asyncio.run(checkpoint_utils.save_checkpoint_async(_Client(), "000002", folder, loop_state, kind="both"))  # type: ignore[arg-type]
    print(f"cookbook: wrote {Path(folder) / 'checkpoints.jsonl'}")


if __name__ == "__main__":
    command, run_dir = sys.argv[1:]
    {"read": read, "write": write}[command](run_dir)
