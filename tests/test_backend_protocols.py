"""Every backend, client and the command line's backend wrapper has every method of its protocol, alike.

The tests pass backends around as ``Any`` (``tests/hf_helpers.backend``), so
mypy alone never noticed that ``HFBackend`` had no ``create_sampling_client``:
:func:`_statically` makes mypy check each class against its protocol, and the
tests below check the same at run time, signatures included.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from trio_rl.backends._tinker_samplers import TinkerSamplingClient
from trio_rl.backends._tinker_training import TinkerTrainingClient
from trio_rl.backends.hf import HFBackend, HFSamplingClient, HFTrainingClient
from trio_rl.backends.local import LocalBackend
from trio_rl.backends.local.sampler import LocalSamplingClient
from trio_rl.backends.local.training import LocalTrainingClient
from trio_rl.backends.protocol import (
    Backend,
    SamplingClient,
    TrainingClient,
    check_inflight_before_work,
    check_loss_before_work,
)
from trio_rl.backends.tinker import TinkerBackend
from trio_rl.cli.backend import LazyTokenizer, _BindTokenizer
from trio_rl.testing import FakeBackend
from trio_rl.testing.clients import FakeSamplingClient, FakeTrainingClient

BACKENDS: list[type[Any]] = [HFBackend, LocalBackend, FakeBackend, TinkerBackend, _BindTokenizer]
TRAINING_CLIENTS: list[type[Any]] = [HFTrainingClient, LocalTrainingClient, FakeTrainingClient, TinkerTrainingClient]
SAMPLING_CLIENTS: list[type[Any]] = [HFSamplingClient, LocalSamplingClient, FakeSamplingClient, TinkerSamplingClient]


def _statically(
    backends: tuple[HFBackend, LocalBackend, FakeBackend, TinkerBackend, _BindTokenizer],
    training: tuple[HFTrainingClient, LocalTrainingClient, FakeTrainingClient, TinkerTrainingClient],
    sampling: tuple[HFSamplingClient, LocalSamplingClient, FakeSamplingClient, TinkerSamplingClient],
) -> tuple[list[Backend], list[TrainingClient], list[SamplingClient]]:
    """Never called: mypy checks that each class is its protocol."""
    return list(backends), list(training), list(sampling)


def _members(protocol: type[Any]) -> dict[str, Any]:
    """The methods and properties ``protocol`` declares (its dunders but the context manager's left out)."""
    return {
        name: value
        for name, value in vars(protocol).items()
        if (callable(value) or isinstance(value, property))
        and (not name.startswith("_") or name in ("__aenter__", "__aexit__"))
    }


def _shape(member: Any) -> tuple[bool, list[tuple[str, Any, Any]]]:
    """Whether ``member`` is a coroutine function, and its parameters' names, kinds and defaults (self left out)."""
    parameters = list(inspect.signature(member).parameters.values())[1:]
    return inspect.iscoroutinefunction(member), [(p.name, p.kind, p.default) for p in parameters]


@pytest.mark.parametrize(
    ("protocol", "implementation"),
    [(Backend, c) for c in BACKENDS]
    + [(TrainingClient, c) for c in TRAINING_CLIENTS]
    + [(SamplingClient, c) for c in SAMPLING_CLIENTS],
    ids=lambda x: x.__name__,
)
def test_each_implementation_has_every_protocol_member_with_its_signature(
    protocol: type[Any], implementation: type[Any]
) -> None:
    members = _members(protocol)
    assert "create_sampling_client" in members or protocol is not Backend  # the check checks something
    for name, declared in members.items():
        found = inspect.getattr_static(implementation, name, None)
        assert found is not None, f"{implementation.__name__} has no {name}"
        if isinstance(declared, property):
            assert isinstance(found, property), f"{implementation.__name__}.{name} is not a property"
            continue
        assert _shape(getattr(implementation, name)) == _shape(declared), f"{implementation.__name__}.{name}"


def test_the_command_lines_wrapper_passes_on_its_backends_in_flight_weights(tmp_path: Any) -> None:
    # check_inflight_before_work looks the method up on the backend it is given: the wrapper.
    check_inflight_before_work(_BindTokenizer(FakeBackend(), LazyTokenizer()))
    check_inflight_before_work(_BindTokenizer(LocalBackend(log_dir=tmp_path), LazyTokenizer()))

    class NoInflightFake:
        pass

    with pytest.raises(ValueError, match="NoInflightFake has no in-flight weights"):
        check_inflight_before_work(_BindTokenizer(NoInflightFake(), LazyTokenizer()))  # type: ignore[arg-type]


def test_the_command_lines_wrapper_names_its_backend_when_it_refuses_a_loss(tmp_path: Any) -> None:
    wrapped = _BindTokenizer(LocalBackend(log_dir=tmp_path), LazyTokenizer())
    with pytest.raises(ValueError, match=r"stable_reinforce.*\(LocalBackend\)") as info:
        check_loss_before_work(wrapped, "stable_reinforce", None)
    assert "_BindTokenizer" not in str(info.value)
    check_loss_before_work(wrapped, "importance_sampling", None)
