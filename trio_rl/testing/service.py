"""What every fake client shares: the fake backend's settings, its records and its saved states."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from .calls import FakeCall, FakeLatencies, Latency
from .sampler_model import FakeSamplerModel, FakeSequence, SamplerModel, start_order


class FakeService:
    """The state the fake clients share; :class:`~trio_rl.testing.FakeBackend` adds the factory methods.

    Its keyword-only arguments are :class:`~trio_rl.testing.FakeBackend`'s (see there).
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        sample_latency: Latency = 0.0,
        train_latency: Latency = 0.0,
        latencies: FakeLatencies | None = None,
        sampler: FakeSamplerModel | None = None,
        record_calls: bool = True,
    ) -> None:
        self.seed = seed
        self.sample_latency = sample_latency
        self.train_latency = train_latency
        self.latencies = latencies or FakeLatencies()
        self.sampler = sampler or FakeSamplerModel()
        self.record_calls = record_calls
        self.calls: list[FakeCall] = []
        self.states: dict[str, int] = {}
        self.samplers: dict[str, int] = {}
        """The weights version of each sampler saved by name, for ``create_sampling_client``."""
        self.fail_sample: BaseException | None = None
        self.fail_train: BaseException | None = None
        self.sampler_model = SamplerModel(self.sampler, record_calls) if self.sampler.modelled else None

    @property
    def sequences(self) -> list[FakeSequence]:
        """Every response the sampler model produced, by start time (ties in queue order).

        Empty without the sampler model or with ``record_calls=False``.
        """
        if self.sampler_model is None:
            return []
        return sorted(self.sampler_model.sequences, key=start_order)

    def record(self, kind: str, version: int, **detail: object) -> None:
        """Keep one :class:`FakeCall` (when ``record_calls``)."""
        if self.record_calls:
            self.calls.append(FakeCall(kind, trio.current_time(), version, dict(detail)))

    def calls_of(self, kind: str) -> list[FakeCall]:
        """The recorded calls of one kind, in order."""
        return [c for c in self.calls if c.kind == kind]

    def response_lengths(self, prompt_tokens: Sequence[int], count: int, max_tokens: int) -> list[int]:
        """The lengths of ``count`` responses by ``sampler.response_length``, capped at ``max_tokens``.

        Raises:
            ValueError: when ``response_length`` returns a negative length.
        """
        response_length = self.sampler.response_length
        assert response_length is not None
        lengths = []
        for index in range(count):
            length = response_length(prompt_tokens, index)
            if length < 0:
                raise ValueError(
                    f"FakeBackend: response_length returned {length} for sample {index} "
                    f"of prompt {list(prompt_tokens[:8])}...; a length must be >= 0"
                )
            lengths.append(min(length, max_tokens))
        return lengths
