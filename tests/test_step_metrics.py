"""What the trainer writes into each step's record."""

from __future__ import annotations

from trio_rl import _tinker_compat as compat
from trio_rl.step_metrics import result_metrics


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
