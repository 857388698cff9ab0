"""A fake evaluator that records which weights versions it evaluated."""

from __future__ import annotations

from typing import Any

import trio


class FakeEvaluator:
    """Records which weights versions it evaluated; optionally slow or failing."""

    def __init__(self, latency: float = 0.0, fail_on_call: int | None = None) -> None:
        self.latency = latency
        self.fail_on_call = fail_on_call
        self.versions: list[int] = []

    async def __call__(self, sampling_client: Any) -> dict[str, float]:
        if self.fail_on_call is not None and len(self.versions) == self.fail_on_call:
            raise RuntimeError("fake evaluator failed")
        await trio.sleep(self.latency)
        version = getattr(sampling_client, "version", -1)
        self.versions.append(version)
        return {"test/version": float(version)}
