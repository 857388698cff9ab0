"""Seeds derived from identities."""

from __future__ import annotations

from trio_rl.determinism import derive_seed


def test_derived_seeds_fit_a_non_negative_int32() -> None:
    seeds = [derive_seed(seed, batch, group) for seed in range(3) for batch in range(50) for group in range(50)]
    assert all(0 <= s < 2**31 for s in seeds)
    assert len(set(seeds)) == len(seeds)


def test_derived_seeds_depend_only_on_their_parts() -> None:
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    assert derive_seed(1, 2, 3) != derive_seed(1, 3, 2)
    assert derive_seed("run", 1) != derive_seed("run", 2)
