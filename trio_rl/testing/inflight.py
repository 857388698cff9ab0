"""The fake training client's in-flight weights: which version each token came from."""

from __future__ import annotations

import bisect
import math

import trio


class InflightWeights:
    """A fake training client's in-flight weights: each version published in flight, and when.

    A token produced at time ``t`` comes from the newest version published
    before ``t``. A publication at the very instant a token is produced counts
    from the next token on: the token's version then never depends on which of
    the two tasks Trio ran first.
    """

    def __init__(self) -> None:
        self._times: list[float] = []
        self._versions: list[int] = []

    def publish(self, version: int) -> None:
        """Make ``version`` the in-flight weights from now on."""
        self._times.append(trio.current_time())
        self._versions.append(version)

    def token_versions(self, floor: int, started: float, spacing: float, count: int) -> tuple[int, ...]:
        """The versions of ``count`` tokens, token ``i`` produced at ``started + (i + 1) * spacing``.

        None is older than ``floor`` (the version of the client that asked).
        """
        if count <= 0:
            return ()

        def produced(i: int) -> float:
            # Exactly FakeSequence.token_time's arithmetic, so that tests compare equal floats.
            return started + (i + 1) * spacing

        start = bisect.bisect_left(self._times, produced(0))
        version = max(floor, self._versions[start - 1]) if start else floor
        out: list[int] = []
        for when, newer in zip(self._times[start:], self._versions[start:], strict=True):
            # The tokens produced up to ``when`` keep ``version``; the rest see ``newer``.
            kept = count if spacing <= 0 else min(count, max(len(out), math.floor((when - started) / spacing)))
            # The division may be off by one at a boundary: settle it on the token times themselves.
            while kept > len(out) and produced(kept - 1) > when:
                kept -= 1
            while kept < count and produced(kept) <= when:
                kept += 1
            out.extend([version] * (kept - len(out)))
            if kept == count:
                break
            version = max(floor, newer)
        out.extend([version] * (count - len(out)))
        return tuple(out)
