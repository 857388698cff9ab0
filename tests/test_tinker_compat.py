"""Building tinker's pydantic types without pydantic's per-call walk must give what pydantic gives."""

from __future__ import annotations

import pydantic
import pytest
from tinker import types as tinker_types

from trio_rl import _tinker_compat as compat


def test_a_model_input_from_ints_equals_the_sdks_own() -> None:
    built = compat.model_input_from_ints([5, 6, 7])
    expected = tinker_types.ModelInput.from_ints([5, 6, 7])
    assert built == expected
    assert built.model_dump() == expected.model_dump()
    assert built.model_fields_set == expected.model_fields_set
    assert built.to_ints() == [5, 6, 7] and compat.token_count(built) == built.length == 3
    chunk = tinker_types.EncodedTextChunk.model_construct(tokens=[5, 6, 7], type="encoded_text")
    assert built.chunks[0].model_fields_set == chunk.model_fields_set  # as model_construct built it before


def test_built_params_equal_model_construct_ones() -> None:
    build = compat.unvalidated_builder(tinker_types.SamplingParams)
    values = dict(tinker_types.SamplingParams(max_tokens=4))
    built = build({**values, "seed": 3}, {"max_tokens", "seed"})
    expected = tinker_types.SamplingParams.model_construct({"max_tokens", "seed"}, **{**values, "seed": 3})
    assert built == expected
    assert built.model_dump(exclude_unset=True) == expected.model_dump(exclude_unset=True)
    assert built.model_dump(exclude_unset=True) == {"max_tokens": 4, "seed": 3}
    assert built.model_copy(update={"top_k": 2}).top_k == 2


class _Mutable(pydantic.BaseModel):
    x: int
    y: int = 0


def test_an_assigned_field_is_recorded_on_that_instance_alone() -> None:
    build = compat.unvalidated_builder(_Mutable)
    a, b = build({"x": 1, "y": 0}, {"x"}), build({"x": 2, "y": 0}, {"x"})
    a.y = 5
    assert a.model_fields_set == {"x", "y"} and b.model_fields_set == {"x"}


def test_copies_of_mutable_params_do_not_share_their_fields_set() -> None:
    from trio_rl import ParamsPerCall

    class MutableParams(_Mutable):
        stop: list[int] | None = None
        seed: int | None = None

    per_call = ParamsPerCall(MutableParams(x=1))  # type: ignore[arg-type]
    first, second = per_call([1], 1), per_call([2], 2)
    first.y = 9  # type: ignore[attr-defined]  # a field the model does not declare
    assert "y" in first.model_fields_set and "y" not in second.model_fields_set


class _WithPrivate(pydantic.BaseModel):
    x: int
    _cache: int = pydantic.PrivateAttr(default=7)


def test_a_model_with_private_state_is_left_to_model_construct() -> None:
    built = compat.unvalidated_builder(_WithPrivate)({"x": 1}, {"x"})
    assert built.x == 1 and built._cache == 7


def test_inputs_that_share_a_fields_set_are_independent_under_copy_and_assignment() -> None:
    first, second = compat.model_input_from_ints([1, 2]), compat.model_input_from_ints([3])
    copied = first.model_copy(update={"chunks": []})
    assert copied.chunks == [] and first.to_ints() == [1, 2] and second.to_ints() == [3]
    assert first.model_fields_set == second.model_fields_set == {"chunks"}
    # Frozen: no instance can add to the set they share.
    with pytest.raises(pydantic.ValidationError):
        first.chunks = []
    assert second.model_fields_set == {"chunks"}
