"""Construct ``tinker.types`` values the same way on every supported SDK version.

The SDK's response types changed shape across releases (``SampledSequence``
gained a required ``sequence_id`` after 0.24). Backends that build responses
themselves (the fake and the local one) go through here.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import inspect
import itertools
from collections.abc import Callable, Sequence
from typing import Any, get_args

import numpy as np
import pydantic
from tinker import types as tinker_types


@dataclasses.dataclass(frozen=True)
class VersionedSequence(tinker_types.SampledSequence):
    """A sampled sequence that also says which weights version produced each token.

    Backends that know it (``FakeBackend``, ``LocalBackend``, ``HFBackend``)
    return these from an in-flight sampling client; the Tinker service does not
    say, so its sequences are plain ``SampledSequence`` objects.

    Attributes:
        token_versions: for each generated token, the weights version that
            produced it: the optimizer steps its training client had taken (the
            loop's step, since in-flight runs take one optimizer step per step);
            as long as ``tokens``.
    """

    token_versions: tuple[int, ...] = ()


_SEQUENCE_FIELDS = {f.name for f in dataclasses.fields(tinker_types.SampledSequence)}
_sequence_ids = itertools.count()


def sampled_sequence(
    tokens: Sequence[int],
    logprobs: Sequence[float] | None,
    stop_reason: tinker_types.StopReason,
    token_versions: Sequence[int] | None = None,
) -> tinker_types.SampledSequence:
    """Build a ``SampledSequence`` from plain token and logprob lists.

    With ``token_versions`` (one per token), a
    ``VersionedSequence`` that carries them.
    """
    kwargs: dict[str, object] = {
        "stop_reason": stop_reason,
        "tokens_np": np.asarray(tokens, dtype=np.int32),
        "logprobs_np": None if logprobs is None else np.asarray(logprobs, dtype=np.float32),
    }
    if "sequence_id" in _SEQUENCE_FIELDS:
        kwargs["sequence_id"] = f"local-{next(_sequence_ids)}"
    if token_versions is None:
        return tinker_types.SampledSequence(**kwargs)  # type: ignore[arg-type]
    if len(token_versions) != len(tokens):
        raise ValueError(f"{len(token_versions)} token versions for {len(tokens)} tokens")
    return VersionedSequence(**kwargs, token_versions=tuple(token_versions))  # type: ignore[arg-type]


def sample_response(sequences: Sequence[tinker_types.SampledSequence]) -> tinker_types.SampleResponse:
    """Build a ``SampleResponse`` holding ``sequences``."""
    return tinker_types.SampleResponse(sequences=list(sequences))


def forward_backward_output(
    loss_fn_outputs: list[dict[str, tinker_types.TensorData]], metrics: dict[str, float]
) -> tinker_types.ForwardBackwardOutput:
    """Build a ``ForwardBackwardOutput`` as the service returns it."""
    return tinker_types.ForwardBackwardOutput(
        loss_fn_output_type="TensorData", loss_fn_outputs=loss_fn_outputs, metrics=metrics
    )


def unvalidated_builder(cls: type[Any]) -> Callable[[dict[str, Any], set[str]], Any]:
    """A function ``(values, fields_set) -> instance`` that builds what ``cls.model_construct`` builds.

    ``values`` must hold every field, already valid (we built them), and
    ``fields_set`` is what ``model_fields_set`` will report. Callers may pass one
    set for every instance: a frozen model's instances share it (none can add to
    it, and ``model_copy`` copies it before an update), and a mutable model's
    each get a copy, since pydantic adds an assigned field to it. ``model_construct``
    walks every field for aliases and defaults on each call; for the three
    ``ModelInput`` and one ``SamplingParams`` a rollout makes, that walk was a
    tenth of the pipeline's CPU. The instance gets the attributes a pydantic 2
    ``model_construct`` sets; a model with extra fields allowed, private
    attributes or a post-init hook is left to ``model_construct`` itself.
    """
    plain = (
        isinstance(cls, type)
        and issubclass(cls, pydantic.BaseModel)
        and cls.model_config.get("extra") != "allow"
        and not cls.__private_attributes__
        and cls.model_post_init is pydantic.BaseModel.model_post_init
    )
    own_set: Callable[[set[str]], set[str]] = (lambda fields_set: fields_set) if cls.model_config.get("frozen") else set
    if not plain:
        return lambda values, fields_set: cls.model_construct(own_set(fields_set), **values)
    model: Any = cls  # a pydantic model class: its __new__ takes the class alone
    new, set_attribute = model.__new__, object.__setattr__

    def build(values: dict[str, Any], fields_set: set[str]) -> Any:
        instance = new(cls)
        set_attribute(instance, "__dict__", values)
        set_attribute(instance, "__pydantic_fields_set__", own_set(fields_set))
        set_attribute(instance, "__pydantic_extra__", None)
        set_attribute(instance, "__pydantic_private__", None)
        return instance

    return build


_new_chunk = unvalidated_builder(tinker_types.EncodedTextChunk)
_new_model_input = unvalidated_builder(tinker_types.ModelInput)
# One set for every chunk and input built here (shared, as both models are
# frozen): a set per instance was a seventh of the objects the garbage
# collector tracked for each finished group.
_CHUNK_FIELDS_SET = {"tokens", "type"}
_MODEL_INPUT_FIELDS_SET = {"chunks"}


def model_input_from_ints(tokens: list[int]) -> tinker_types.ModelInput:
    """``ModelInput.from_ints`` without re-validating every token id.

    The ids come from our own lists of ints, and pydantic's per-item validation
    was the largest cost of building a Datum.
    """
    chunk = _new_chunk({"tokens": tokens, "type": "encoded_text"}, _CHUNK_FIELDS_SET)
    return _new_model_input({"chunks": [chunk]}, _MODEL_INPUT_FIELDS_SET)  # type: ignore[no-any-return]


def token_ids(model_input: tinker_types.ModelInput, where: str) -> list[int]:
    """The token ids of ``model_input``, for the local backends, which take token chunks only.

    Raises:
        ValueError: ``model_input`` holds another chunk (an image), naming ``where`` and the chunk.
    """
    for chunk in model_input.chunks:
        if not isinstance(chunk, tinker_types.EncodedTextChunk):
            raise ValueError(
                f"{where} holds a {type(chunk).__name__} (type {getattr(chunk, 'type', '?')!r}); the local "
                "backends (LocalBackend, HFBackend) take token chunks only, so observations with images "
                "sample and train on TinkerBackend"
            )
    return model_input.to_ints()


def token_count(model_input: tinker_types.ModelInput) -> int:
    """``model_input.length``, without a generator for the usual single chunk."""
    chunks = model_input.chunks
    return chunks[0].length if len(chunks) == 1 else model_input.length


def tensor(values: Sequence[float] | Sequence[int] | np.ndarray, dtype: str) -> tinker_types.TensorData:
    """A 1-D ``TensorData`` of ``dtype`` (``"float32"`` or ``"int64"``)."""
    return tinker_types.TensorData(data=np.asarray(values, dtype=dtype), dtype=dtype)  # type: ignore[arg-type]


def with_loss_fn_inputs(datum: tinker_types.Datum, inputs: dict[str, tinker_types.TensorData]) -> tinker_types.Datum:
    """``datum`` with other ``loss_fn_inputs`` (a dataclass in recent SDKs, a pydantic model in older ones).

    The inputs are the datum's own, less some or with values of the same shapes, so
    the SDK's validation is not run again (it was the larger part of the cost of
    dropping every Datum's mask at submission).
    """
    if dataclasses.is_dataclass(datum):
        copied = copy.copy(datum)
        object.__setattr__(copied, "loss_fn_inputs", inputs)
        return copied
    return datum.model_copy(update={"loss_fn_inputs": inputs})  # type: ignore[attr-defined]


HAS_PROVENANCE = hasattr(tinker_types, "SampledProvenanceSpan") and hasattr(tinker_types.Datum, "with_provenance")
"""Whether this SDK can say which sampled sequence a Datum's tokens came from (after 0.24)."""


def _sdk_version() -> str:
    try:
        return f"tinker {importlib.metadata.version('tinker')}"
    except importlib.metadata.PackageNotFoundError:
        return "tinker SDK"


SDK_VERSION = _sdk_version()
"""The installed SDK, as named in error messages (``"tinker 0.38.0"``)."""


def _samplers_record_stability_info() -> bool:
    try:
        import tinker

        return "record_stability_info" in inspect.signature(tinker.TrainingClient.create_sampling_client).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return False


HAS_STABLE_REINFORCE = (
    "stable_reinforce" in get_args(tinker_types.LossFnType) and HAS_PROVENANCE and _samplers_record_stability_info()
)
"""Whether this SDK can train ``stable_reinforce``: it names the loss, carries provenance on a
Datum, and creates samplers with ``record_stability_info`` (0.38; 0.24.1 has none of the three)."""


def _saves_inflight_weights() -> bool:
    try:
        import tinker

        save = tinker.TrainingClient.save_weights_and_get_sampling_client
        return "kind" in inspect.signature(save).parameters and hasattr(tinker_types, "SamplingClientKind")
    except (ImportError, AttributeError, TypeError, ValueError):
        return False


HAS_INFLIGHT_WEIGHTS = _saves_inflight_weights()
"""Whether this SDK can publish in-flight weights: ``save_weights_and_get_sampling_client(kind="inflight")``
(0.38; 0.24.1 has no ``kind``, and its sampling clients are all snapshots)."""


def prompt_span(sequence_id: str, *, offset: int, length: int) -> Any:
    """Tokens ``offset:offset + length`` of the prompt of the request that sampled ``sequence_id``."""
    return tinker_types.PromptProvenanceSpan(sequence_id=sequence_id, offset=offset, length=length)  # type: ignore[attr-defined]


def sampled_span(sequence_id: str, *, length: int) -> Any:
    """The first ``length`` sampled tokens of ``sequence_id``."""
    return tinker_types.SampledProvenanceSpan(sequence_id=sequence_id, length=length)  # type: ignore[attr-defined]


def is_sampled_span(span: Any) -> bool:
    """Whether ``span`` covers sampled tokens (not prompt tokens)."""
    return isinstance(span, tinker_types.SampledProvenanceSpan)  # type: ignore[attr-defined]


def drop_first(spans: list[Any]) -> list[Any]:
    """The spans of the same tokens without the first position."""
    first, rest = spans[0], spans[1:]
    if first.length == 1:
        return rest
    return [dataclasses.replace(first, offset=first.offset + 1, length=first.length - 1), *rest]


def drop_last(spans: list[Any]) -> list[Any]:
    """The spans of the same tokens without the last position."""
    last, rest = spans[-1], spans[:-1]
    if last.length == 1:
        return rest
    return [*rest, dataclasses.replace(last, length=last.length - 1)]


def with_provenance(datum: tinker_types.Datum, model_input: list[Any], loss_fn_inputs: list[Any]) -> tinker_types.Datum:
    """``datum`` carrying provenance spans (validated by the SDK against the Datum's lengths)."""
    # tinker 0.24.1's Datum has no with_provenance (the call is then Any); 0.38's has it, typed.
    return datum.with_provenance(model_input=model_input, loss_fn_inputs=loss_fn_inputs)  # type: ignore[attr-defined, no-any-return]
