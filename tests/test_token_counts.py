"""TokenCounts: adding two adds every kind of token, whatever kinds the class holds."""

from __future__ import annotations

from dataclasses import fields

from trio_rl.loop.step_metrics import TokenCounts


def test_adding_token_counts_adds_every_field() -> None:
    names = [f.name for f in fields(TokenCounts)]
    left = TokenCounts(**{name: 10 ** (i + 1) for i, name in enumerate(names)})
    right = TokenCounts(**{name: i + 1 for i, name in enumerate(names)})
    total = left + right
    # Written field by field (for speed), so a field added later and forgotten there fails here.
    assert [getattr(total, name) for name in names] == [10 ** (i + 1) + i + 1 for i in range(len(names))]


def test_token_counts_metrics_name_each_kind_under_the_prefix() -> None:
    counts = TokenCounts(sampled=3, prefill_cached=1, prefill_uncached=2, trained=4)
    assert counts.metrics("tokens") == {
        "tokens/sampled": 3,
        "tokens/prefill_cached": 1,
        "tokens/prefill_uncached": 2,
        "tokens/trained": 4,
    }
