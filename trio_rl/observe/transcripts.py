"""Transcripts: what the model said, what it was rewarded, and what was trained on it.

Every ``Config.transcripts_every`` steps, the run writes, for ``transcript_groups``
of the step's groups (tinker-cookbook 0.6.1's ``num_groups_to_log``):

- ``iteration_NNNNNN/train_transcript.html``: a self-contained page, per group,
  per trajectory, every turn: the observation, the decoded action with its stop
  reason, the reward, the env's logs (``StepResult.logs``), the weights version
  of the action's tokens; and the trajectory's total reward and advantage;
- ``iteration_NNNNNN/train_rollouts.jsonl``: one line per trajectory of those
  groups, with the same content as token ids and text, and the Datums built from
  it exactly as they were handed to ``forward_backward`` (with their mask).

A group is captured (:meth:`GroupTranscript.of`) by its rollout worker, before
its trajectories are dropped, only when the run writes transcripts. Files are
per step and written whole (a temporary file renamed), so a resumed run that
trains a step again replaces that step's files and never duplicates one.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tinker import types as tinker_types

from ..types import TrajectoryGroup
from .files import write_atomically

Decode = Callable[[Sequence[int]], str]
"""Token ids to text (a tokenizer's ``decode``)."""


@dataclass(frozen=True)
class Turn:
    """One turn of a trajectory, as token ids (decoded when the page is written)."""

    observation: list[int]
    action: list[int]
    stop_reason: str
    reward: float
    episode_done: bool
    logs: dict[str, Any]
    metrics: dict[str, Any]
    token_versions: list[int] | None
    """Per action token, the weights version that sampled it, where the backend says."""


@dataclass(frozen=True)
class TrajectoryTranscript:
    """One trajectory: its turns, rewards, advantage, and the Datums trained on it."""

    turns: list[Turn]
    final_reward: float
    total_reward: float
    advantage: float
    stop_reason: str | None
    data: list[dict[str, Any]]
    """Each Datum of this trajectory: ``model_input`` token ids and every ``loss_fn_inputs`` array as a list."""


@dataclass(frozen=True)
class GroupTranscript:
    """One group as its worker finished it.

    Attributes:
        batch, group: its place in the dataset.
        attempt: 0 unless it was resampled.
        version: the weights version it was sampled from.
        tags: the builder's ``logging_tags()``.
        trajectories: each trajectory's transcript.
    """

    batch: int
    group: int
    attempt: int
    version: int
    tags: list[str]
    trajectories: list[TrajectoryTranscript]

    @classmethod
    def of(
        cls,
        key: tuple[int, int, int],
        version: int,
        group: TrajectoryGroup,
        advantages: Sequence[float],
        data: Sequence[Sequence[tinker_types.Datum]],
        tags: Sequence[str] = (),
    ) -> GroupTranscript:
        """Capture ``group`` (``key`` is batch, group, attempt), with each trajectory's advantage and Datums."""
        batch, index, attempt = key
        trajectories = [
            TrajectoryTranscript(
                turns=[_turn(t) for t in trajectory.transitions],
                final_reward=final,
                total_reward=sum(t.reward for t in trajectory.transitions) + final,
                advantage=advantage,
                stop_reason=trajectory.stop_reason,
                data=[datum_json(d) for d in datums],
            )
            for trajectory, final, advantage, datums in zip(
                group.trajectories_G, group.final_rewards_G, advantages, data, strict=True
            )
        ]
        return cls(batch, index, attempt, version, list(tags), trajectories)

    def with_trained_data(self, data: Sequence[tinker_types.Datum]) -> GroupTranscript:
        """This transcript with its Datums replaced by ``data`` (the same number, in order), as changed at the trainer.

        The KL penalty is added to the advantages when a step submits its data, after the
        worker captured the group: the transcript records what was trained.
        """
        flat = iter(data)
        trajectories = [replace(t, data=[datum_json(next(flat)) for _ in t.data]) for t in self.trajectories]
        if next(flat, None) is not None:
            raise ValueError("more Datums than the transcript holds")
        return replace(self, trajectories=trajectories)


def datum_json(datum: tinker_types.Datum) -> dict[str, Any]:
    """A Datum's token ids and loss inputs as plain lists (what a transcript records of it)."""
    return {
        "model_input": datum.model_input.to_ints(),
        "loss_fn_inputs": {name: list(tensor.data) for name, tensor in datum.loss_fn_inputs.items()},
    }


def _turn(transition: Any) -> Turn:
    ac = transition.ac
    return Turn(
        observation=_ints(transition.ob),
        action=list(ac.tokens),
        stop_reason=str(ac.stop_reason),
        reward=float(transition.reward),
        episode_done=bool(transition.episode_done),
        logs=dict(transition.logs),
        metrics=dict(transition.metrics),
        token_versions=None if ac.token_versions is None else list(ac.token_versions),
    )


def _ints(ob: tinker_types.ModelInput) -> list[int]:
    tokens: list[int] = []
    for chunk in ob.chunks:
        # An image chunk has no token ids to show; its place is kept as nothing.
        if isinstance(chunk, tinker_types.EncodedTextChunk):
            tokens.extend(chunk.tokens)
    return tokens


def _versions(versions: list[int] | None) -> str:
    if versions is None:
        return "not reported by the backend"
    counts: dict[int, int] = {}
    for v in versions:
        counts[v] = counts.get(v, 0) + 1
    return ", ".join(f"v{v}: {n} tokens" for v, n in sorted(counts.items())) or "no tokens"


def rollout_records(
    split: str, step: int, groups: Iterable[tuple[GroupTranscript, bool]], decode: Decode
) -> list[dict[str, Any]]:
    """One JSON record per trajectory of ``groups`` (each with whether its step trained it)."""
    records = []
    for transcript, trained in groups:
        for index, t in enumerate(transcript.trajectories):
            turns = []
            for turn in t.turns:
                row = asdict(turn)
                row["observation_text"] = decode(turn.observation)
                row["action_text"] = decode(turn.action)
                turns.append(row)
            records.append(
                {
                    "split": split,
                    "step": step,
                    "batch": transcript.batch,
                    "group": transcript.group,
                    "attempt": transcript.attempt,
                    "sampled_version": transcript.version,
                    "trajectory": index,
                    "trained": trained,
                    "tags": transcript.tags,
                    "total_reward": t.total_reward,
                    "final_reward": t.final_reward,
                    "advantage": t.advantage,
                    "stop_reason": t.stop_reason,
                    "turns": turns,
                    "data": t.data,
                }
            )
    return records


_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 16px; color: #222; max-width: 1100px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 24px; border-bottom: 1px solid #ccc; }
details { margin: 6px 0 6px 12px; } summary { cursor: pointer; }
pre { white-space: pre-wrap; word-break: break-word; background: #f6f6f6; padding: 6px; margin: 2px 0; }
.ob { border-left: 3px solid #4e79a7; } .ac { border-left: 3px solid #59a14f; background: #f2f9f0; }
.meta { color: #555; font-size: 12px; } table { border-collapse: collapse; font-size: 12px; }
td, th { border: 1px solid #ddd; padding: 2px 6px; text-align: left; }
"""


def transcript_html(title: str, step: int, groups: Sequence[tuple[GroupTranscript, bool]], decode: Decode) -> str:
    """The self-contained page of ``groups`` at ``step`` (each with whether its step trained it)."""
    e = html.escape
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>'
        f"<style>{_STYLE}</style></head><body><h1>{e(title)}</h1>"
        f'<p class="meta">Step {step}: {len(groups)} groups. Each trajectory lists every turn: the observation, '
        "the sampled action (decoded) with its stop reason, the turn's reward and the env's logs.</p>"
    ]
    for transcript, trained in groups:
        rewards = [t.total_reward for t in transcript.trajectories]
        parts.append(
            f"<h2>Group {transcript.batch}/{transcript.group} (attempt {transcript.attempt}), "
            f"sampled from weights v{transcript.version}{'' if trained else ', not trained (filtered)'}</h2>"
            f'<p class="meta">tags: {e(", ".join(transcript.tags) or "none")}; total rewards: '
            f"{e(', '.join(f'{r:.4g}' for r in rewards))}</p>"
        )
        for index, t in enumerate(transcript.trajectories):
            parts.append(
                f"<details open><summary>Trajectory {index}: total reward {t.total_reward:.4g}, "
                f"advantage {t.advantage:.4g}, {len(t.turns)} turns, stop: {e(str(t.stop_reason))}</summary>"
            )
            parts.extend(_turn_html(i, turn, decode) for i, turn in enumerate(t.turns))
            if t.final_reward:
                parts.append(f'<p class="meta">final group reward: {t.final_reward:.4g}</p>')
            parts.append("</details>")
    parts.append("</body></html>\n")
    return "".join(parts)


def _turn_html(index: int, turn: Turn, decode: Decode) -> str:
    e = html.escape
    logs = "".join(f"<tr><th>{e(str(k))}</th><td>{e(str(v))}</td></tr>" for k, v in turn.logs.items())
    return (
        f'<div><p class="meta">turn {index}: reward {turn.reward:.4g}, stop reason {e(turn.stop_reason)}, '
        f"{'episode done' if turn.episode_done else 'continues'}; weights of the action's tokens: "
        f"{e(_versions(turn.token_versions))}</p>"
        f'<pre class="ob">{e(_visible(decode(turn.observation)))}</pre>'
        f'<pre class="ac">{e(_visible(decode(turn.action)))}</pre>'
        + (f"<table>{logs}</table>" if logs else "")
        + "</div>"
    )


def _visible(text: str) -> str:
    """``text`` with control characters other than newlines and tabs written as ``\\xNN`` (a page would drop them)."""
    return "".join(c if c.isprintable() or c in "\n\t" else f"\\x{ord(c):02x}" for c in text)


@dataclass(frozen=True)
class TranscriptWriter:
    """Writes a step's transcript page and rollout JSONL into the run folder.

    Args:
        log_path: the run folder.
        decode: token ids to text (the tokenizer's ``decode``).
    """

    log_path: Path
    decode: Decode

    def write(self, split: str, step: int, groups: Sequence[tuple[GroupTranscript, bool]]) -> Path:
        """Write ``split``'s files (``train`` or an evaluation's name) for ``step``; the page's path."""
        folder = iteration_dir(self.log_path, step)
        records = rollout_records(split, step, groups, self.decode)
        write_atomically(folder / f"{split}_rollouts.jsonl", "".join(json.dumps(r) + "\n" for r in records))
        page = folder / f"{split}_transcript.html"
        write_atomically(page, transcript_html(f"{split} transcript, step {step}", step, groups, self.decode))
        return page


def iteration_dir(log_path: Path, step: int) -> Path:
    """A step's folder in the run folder, as tinker-cookbook 0.6.1 names it (``iteration_000012``)."""
    return log_path / f"iteration_{step:06d}"


def token_ids(tokens: Sequence[int]) -> str:
    """A :data:`Decode` for runs without a tokenizer: the ids themselves."""
    return " ".join(str(t) for t in tokens)
