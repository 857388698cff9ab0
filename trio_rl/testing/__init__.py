"""Fakes for tests and benchmarks: a virtual-time backend and configurable fake envs.

:class:`FakeBackend` runs natively in Trio with no threads, so it works under
``trio.testing.MockClock`` (``autojump_clock`` in pytest-trio): every latency is a
``trio.sleep``. It is deterministic from its seed and records every call with
the weights version it saw, so tests can assert on order and staleness. Given a
:class:`FakeSamplerModel` with ``slots``, ``token_latency`` or ``response_length``
it also models a sampler with a finite number of sequences in flight (see
:class:`FakeBackend`), which is what a long tail of response lengths costs a real one.

The fake envs (:class:`FakeEnv`, :class:`FakeEnvGroupBuilder`, :class:`FakeDataset`)
give rewards that depend on the sampled tokens, so groups have mixed rewards, and
can be told to fail or hang at a chosen point.

One module per concept: ``calls`` (latencies and call records), ``sampler_model``
(slots and per-token time), ``inflight`` (in-flight weights), ``service`` (what the
clients share), ``clients``, ``backend``, ``envs`` and ``evaluator``.
"""

from .backend import FakeBackend
from .calls import FakeCall, FakeLatencies, Latency, ResponseLength
from .clients import FakeSamplingClient, FakeTokenizer, FakeTrainingClient
from .envs import FailPoint, FakeDataset, FakeEnv, FakeEnvGroupBuilder, FakeEnvSpec
from .evaluator import FakeEvaluator
from .sampler_model import FakeSamplerModel, FakeSequence

__all__ = [
    "FailPoint",
    "FakeBackend",
    "FakeCall",
    "FakeDataset",
    "FakeEnv",
    "FakeEnvGroupBuilder",
    "FakeEnvSpec",
    "FakeEvaluator",
    "FakeLatencies",
    "FakeSamplerModel",
    "FakeSamplingClient",
    "FakeSequence",
    "FakeTokenizer",
    "FakeTrainingClient",
    "Latency",
    "ResponseLength",
]
