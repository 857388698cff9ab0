"""trio_rl's half of the checkpoint round trip with tinker-cookbook 0.6.1 (run by .ci/cookbook_checkpoints.sh).

    trio_side.py write RUN_DIR     a short trio_rl run on fakes, leaving RUN_DIR/checkpoints.jsonl
    trio_side.py resume RUN_DIR    resume from a folder the cookbook wrote; prints where it resumed
"""

from __future__ import annotations

import sys
from pathlib import Path

import trio

from trio_rl import Config, train
from trio_rl.checkpoint import CheckpointLog
from trio_rl.testing import FakeBackend, FakeDataset


async def run(log_path: Path, *, resume: bool) -> None:
    backend = FakeBackend()
    if resume:
        last = CheckpointLog(log_path).last()
        assert last is not None, f"no checkpoint row in {log_path}"
        backend.states[last.state_path] = last.step  # the state the cookbook saved on its service
    config = Config(log_path=log_path, save_every=2, eval_every=0, resume=resume)
    async with backend:
        result = await train(config, dataset=FakeDataset(4, 2), backend=backend)
    steps = [m["step"] for m in result.step_metrics]
    print(f"trio_rl: trained steps {steps}, final step {result.final_step}")
    if resume:
        assert steps and steps[0] == last.step, f"resumed at {steps[:1]}, expected step {last.step}"
        assert result.step_metrics[0]["tokens/cumulative/trained"] > last.cumulative_tokens["trained"]


def main(argv: list[str]) -> None:
    command, folder = argv
    trio.run(lambda: run(Path(folder), resume=command == "resume"))


if __name__ == "__main__":
    main(sys.argv[1:])
