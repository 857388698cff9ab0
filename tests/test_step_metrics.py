"""What the trainer writes into each step's record."""

from __future__ import annotations

import pytest

from trio_rl import _tinker_compat as compat
from trio_rl.loop.step_metrics import result_metrics


def test_step_loss_sums_loss_sum_metrics() -> None:
    outputs = [compat.forward_backward_output([], {"loss:sum": 2.5}), compat.forward_backward_output([], {"loss:sum": 1.0})]
    assert result_metrics(outputs)["train/loss:sum"] == 3.5


def test_step_loss_falls_back_to_per_token_losses() -> None:
    per_token = compat.forward_backward_output(
        [{"elementwise_loss": compat.tensor([0.5, 0.25], "float32")}, {"elementwise_loss": compat.tensor([1.0], "float32")}],
        {},
    )
    assert result_metrics([per_token])["train/loss:sum"] == 1.75


def test_optimizer_metrics_are_prefixed() -> None:
    from tinker import types as tinker_types

    metrics = result_metrics([tinker_types.OptimStepResponse(metrics={"grad_norm": 0.5})])
    assert metrics["optim/grad_norm"] == 0.5


def test_sample_train_kl_is_the_cookbooks_formula_on_action_tokens() -> None:
    from tinker import types as tinker_types

    from trio_rl.loop.step_metrics import sample_train_kl

    datum = tinker_types.Datum(
        model_input=compat.model_input_from_ints([1, 2, 3]),
        loss_fn_inputs={
            "target_tokens": compat.tensor([2, 3, 4], "int64"),
            "logprobs": compat.tensor([0.0, -1.0, -2.0], "float32"),
            "advantages": compat.tensor([0.0, 1.0, 1.0], "float32"),
            "mask": compat.tensor([0.0, 1.0, 1.0], "float32"),
        },
    )
    output = compat.forward_backward_output(
        [{"logprobs": compat.tensor([-9.0, -1.5, -1.0], "float32")}], {"loss:sum": 0.0}
    )
    # Action diffs (sampling - training): 0.5 and -1.0.
    metrics = sample_train_kl([[datum]], [output])
    assert metrics["optim/kl_sample_train_v1"] == pytest.approx((0.5 - 1.0) / 2)
    assert metrics["optim/kl_sample_train_v2"] == pytest.approx(0.5 * (0.25 + 1.0) / 2)
    assert metrics["optim/entropy"] == pytest.approx(1.5)
    no_logprobs = compat.forward_backward_output([{}], {"loss:sum": 0.0})
    assert sample_train_kl([[datum]], [no_logprobs]) == {}
