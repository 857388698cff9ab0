"""Evaluation transcripts: the groups an evaluator rolled out, collected while the evaluator stage runs it.

The evaluator stage opens a collector for each evaluation when the run writes
transcripts; an evaluator that rolls out groups (:class:`~trio_rl.RLTestSetEvaluator`)
adds the first ones to it, under its name; the stage then writes them as
``iteration_NNNNNN/<name>_transcript.html`` and ``<name>_rollouts.jsonl``, under the step
whose weights were evaluated. An evaluator outside a collecting run adds nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from ..types import TrajectoryGroup
from .transcripts import GroupTranscript


class EvaluationTranscripts:
    """The groups of one evaluation to transcribe, by evaluator name.

    Args:
        version: the weights version evaluated.
        groups: how many groups of each evaluator to keep (the first by index).
    """

    def __init__(self, version: int, groups: int) -> None:
        self.version = version
        self.groups = groups
        self.by_name: dict[str, dict[int, GroupTranscript]] = {}

    def wants(self, index: int) -> bool:
        """Whether the group at ``index`` of an evaluator's dataset is one to keep."""
        return index < self.groups

    def add(self, name: str, index: int, group: TrajectoryGroup, tags: list[str]) -> None:
        """Keep ``group`` (the evaluator's ``index``-th) under ``name``; it trained nothing, so it has no Datums."""
        if not self.wants(index):
            return
        rewards = group.get_total_rewards()
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        advantages = [r - mean for r in rewards]
        no_data: list[list[Any]] = [[] for _ in rewards]
        transcript = GroupTranscript.of((0, index, 0), self.version, group, advantages, no_data, tags)
        self.by_name.setdefault(name, {})[index] = transcript


_collecting: ContextVar[EvaluationTranscripts | None] = ContextVar("trio_rl_eval_transcripts", default=None)


def evaluation_transcripts() -> EvaluationTranscripts | None:
    """The collector of the evaluation running here, if the run writes transcripts."""
    return _collecting.get()


@contextlib.contextmanager
def collecting(collector: EvaluationTranscripts | None) -> Iterator[None]:
    """Make ``collector`` the current evaluation's for this block (None: collect nothing)."""
    token = _collecting.set(collector)
    try:
        yield
    finally:
        _collecting.reset(token)
