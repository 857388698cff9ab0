"""The long-tail workload (issue 20), in the standard library only.

Both ``bench/longtail.py`` (trio_rl, virtual time) and both sides of
``bench/vs_cookbook``'s long-tail cell (trio_rl and tinker-cookbook 0.6.1, real
time) import it, so every loop samples exactly the same response lengths. The
cookbook's venv has no trio_rl, hence no import of it here.

- ``steps`` steps of 8 groups x 8 samples, one turn each; an env's prompt is
  ``[1 + batch, 2 + group, 3 + index]`` (``trio_rl.testing.FakeEnv``'s).
- Response lengths are lognormal, median 200 tokens, sigma 1, capped at 4,096,
  each fixed by the prompt's first three tokens and the sample index: a
  hash-seeded draw, so a problem that is hard stays hard when it is resampled.
- The sampler runs 128 sequences at once at 0.5 ms per token; ``forward_backward``
  takes 0.1 s; nothing else takes time.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

STEPS = 100
GROUPS_PER_STEP = 8
GROUP_SIZE = 8
MEDIAN_TOKENS = 200
SIGMA = 1.0
MAX_TOKENS = 4096
SAMPLE_SLOTS = 128
TOKEN_LATENCY_S = 0.0005
TRAIN_S = 0.1


def response_length(prompt: Sequence[int], sample_index: int, draw: int = 0) -> int:
    """Tokens in the response to ``prompt``: a lognormal draw seeded by its first three tokens and the index.

    ``draw`` picks another set of lengths from the same distribution.
    """
    digest = hashlib.blake2b(repr(("longtail", draw, *prompt[:3], sample_index)).encode(), digest_size=8).digest()
    z = random.Random(int.from_bytes(digest, "big")).normalvariate(0.0, 1.0)
    return min(MAX_TOKENS, max(1, round(MEDIAN_TOKENS * math.exp(SIGMA * z))))


def env_prompt(batch: int, group: int, index: int) -> list[int]:
    """The prompt of env ``index`` of group ``group`` of batch ``batch`` (as ``trio_rl.testing.FakeEnv`` builds it)."""
    return [1 + batch, 2 + group, 3 + index]


def workload_lengths(steps: int = STEPS, draw: int = 0) -> list[int]:
    """Every response length of a run over ``steps`` batches, each sampled once, in dataset order."""
    return [
        response_length(env_prompt(b, g, i), 0, draw)
        for b in range(steps)
        for g in range(GROUPS_PER_STEP)
        for i in range(GROUP_SIZE)
    ]


def sampler_bound_limit(steps: int, total_tokens: int) -> float:
    """``max(total tokens x token latency / slots, steps x train time) + train time``.

    No loop can finish sooner: the sampler cannot produce the tokens faster with
    every slot busy, the trainer needs its steps one after the other, and the
    last step's training follows the last sample.
    """
    return max(total_tokens * TOKEN_LATENCY_S / SAMPLE_SLOTS, steps * TRAIN_S) + TRAIN_S


def group_wait_s(steps: int = STEPS, draw: int = 0) -> float:
    """Token-weighted mean time from a token's production to the end of its group's longest answer.

    With a group's answers started together, a token produced at position ``p``
    of its answer waits ``(longest - p) x token latency`` before its group can be
    trained: its group's advantages need every answer's reward. Nothing that
    trains whole groups can beat it, whatever its weights; multiplied by the
    steps per second of a run, it is a floor of the mean token lag in steps.
    """
    waited = tokens = 0.0
    for b in range(steps):
        for g in range(GROUPS_PER_STEP):
            lengths = [response_length(env_prompt(b, g, i), 0, draw) for i in range(GROUP_SIZE)]
            longest = max(lengths)
            for n in lengths:
                waited += n * longest - n * (n + 1) / 2
                tokens += n
    return waited / tokens * TOKEN_LATENCY_S
