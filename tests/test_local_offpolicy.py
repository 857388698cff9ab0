"""The off-policy corrections of the local losses against formulas written out here, token by token."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tinker import types as tinker_types

from tests.local_helpers import SMALL_CONFIG, local_training_client
from trio_rl import _tinker_compat as compat
from trio_rl.backends.local import CharTokenizer
from trio_rl.backends.local.losses import check_loss_fn, importance_sampling
from trio_rl.loop.step_metrics import offpolicy_metrics

# log w = p - q per token: w = e^0.1, e^0.9, e^-1.0, e^0.4, e^1.5 (1.105, 2.46, 0.368, 1.49, 4.48).
LP = [-1.0, -0.1, -2.0, -0.6, -0.5]
SAMPLING = [-1.1, -1.0, -1.0, -1.0, -2.0]
ADV = [2.0, 1.0, -1.0, 0.0, 0.5]  # token 3 carries no advantage: not trained


def _inputs() -> dict[str, torch.Tensor]:
    return {
        "logprobs": torch.tensor(SAMPLING, dtype=torch.float64),
        "advantages": torch.tensor(ADV, dtype=torch.float64),
    }


def _grad(config: dict[str, float], lp_values: list[float] = LP) -> tuple[list[float], list[float]]:
    lp = torch.tensor(lp_values, dtype=torch.float64, requires_grad=True)
    loss = importance_sampling(lp, _inputs(), config)
    loss.sum().backward()  # type: ignore[no-untyped-call]
    assert lp.grad is not None
    return loss.tolist(), lp.grad.tolist()


def _ratios(lp_values: list[float] = LP) -> list[float]:
    return [math.exp(p - q) for p, q in zip(lp_values, SAMPLING, strict=True)]


def test_truncated_importance_sampling_weights_each_token_by_the_capped_ratio() -> None:
    loss, grad = _grad({"tis_cap": 2.0})
    coef = [min(w, 2.0) for w in _ratios()]
    expected = [-c * a for c, a in zip(coef, ADV, strict=True)]
    assert loss == pytest.approx(expected, rel=1e-12)
    # The coefficient is a constant: d/dp of -c * e^(p - sg(p)) * A is -c * A.
    assert grad == pytest.approx(expected, rel=1e-12)


def test_masked_importance_sampling_drops_tokens_above_the_cap() -> None:
    _, grad = _grad({"mis_cap": 2.0})
    expected = [-(w if w <= 2.0 else 0.0) * a for w, a in zip(_ratios(), ADV, strict=True)]
    assert grad == pytest.approx(expected, rel=1e-12)
    assert grad[1] == 0.0 and grad[4] == 0.0 and grad[0] != 0.0


def test_icepop_drops_tokens_outside_its_two_sided_band() -> None:
    _, grad = _grad({"icepop_low": 0.5, "icepop_high": 3.0})
    expected = [-(w if 0.5 <= w <= 3.0 else 0.0) * a for w, a in zip(_ratios(), ADV, strict=True)]
    assert grad == pytest.approx(expected, rel=1e-12)
    assert grad[2] == 0.0 and grad[4] == 0.0 and grad[1] != 0.0  # below 0.5, above 3, inside


@pytest.mark.parametrize(("low", "high", "dropped"), [(0.5, 2.0, False), (1.5, 3.0, True), (0.2, 1.1, True)])
def test_the_geometric_sequence_mask_keeps_or_drops_the_whole_datum(low: float, high: float, dropped: bool) -> None:
    _, grad = _grad({"geo_mask_low": low, "geo_mask_high": high})
    trained = [math.log(w) for w, a in zip(_ratios(), ADV, strict=True) if a != 0]
    geometric = math.exp(sum(trained) / len(trained))  # e^((0.1 + 0.9 - 1.0 + 1.5) / 4) = e^0.375 = 1.45
    assert (not low <= geometric <= high) == dropped
    expected = [0.0 if dropped else -w * a for w, a in zip(_ratios(), ADV, strict=True)]
    assert grad == pytest.approx(expected, rel=1e-12)


def test_the_sequence_mask_combines_with_a_token_correction() -> None:
    _, grad = _grad({"tis_cap": 2.0, "geo_mask_low": 0.5, "geo_mask_high": 2.0})
    assert grad == pytest.approx([-min(w, 2.0) * a for w, a in zip(_ratios(), ADV, strict=True)], rel=1e-12)


def test_without_a_correction_importance_sampling_is_unchanged() -> None:
    loss, grad = _grad({})
    assert loss == pytest.approx([-w * a for w, a in zip(_ratios(), ADV, strict=True)], rel=1e-12)
    assert grad == pytest.approx(loss, rel=1e-12)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"tis_cap": 2.0, "mis_cap": 2.0}, "choose at most one token-level correction"),
        ({"icepop_low": 0.5}, "gives icepop_low without icepop_high"),
        ({"geo_mask_high": 1.01}, "gives geo_mask_high without geo_mask_low"),
        ({"tis_cap": 0.0}, "tis_cap must be > 0"),
        ({"icepop_low": 2.0, "icepop_high": 1.0}, "0 < icepop_low <= icepop_high"),
    ],
)
def test_a_bad_correction_is_refused_naming_the_keys(config: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_loss_fn("importance_sampling", config)


def test_a_correction_key_on_another_loss_is_refused() -> None:
    with pytest.raises(ValueError, match=r"\['tis_cap'\] are not used by 'ppo'"):
        check_loss_fn("ppo", {"tis_cap": 2.0})


def _datum(tokens: list[int], sampler: list[float], advantages: list[float]) -> tinker_types.Datum:
    return tinker_types.Datum(
        model_input=tinker_types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": compat.tensor(tokens[1:], "int64"),
            "logprobs": compat.tensor(sampler, "float32"),
            "advantages": compat.tensor(advantages, "float32"),
        },
    )


async def test_forward_backward_reports_the_weights_statistics_of_its_trained_tokens(tmp_path: Path) -> None:
    tok = CharTokenizer("abc")
    async with local_training_client(tmp_path, deadline_s=30, model_config=SMALL_CONFIG, tokenizer=tok) as (_, client):
        first, second = tok.encode("abcab"), tok.encode("cab")
        # Sampler logprobs far from the model's: -0.2 (w well below 1) and -3.0 (w above 1).
        data = [
            _datum(first, [0.0, -0.2, -3.0, -3.0], [0.0, 1.0, 1.0, -1.0]),
            _datum(second, [-3.0, -0.2], [1.0, 1.0]),
        ]
        out = await (await client.forward_backward(data, "importance_sampling", {"tis_cap": 1.5})).result()
    learner = [o["logprobs"].to_numpy().tolist() for o in out.loss_fn_outputs]
    samplers = [[0.0, -0.2, -3.0, -3.0], [-3.0, -0.2]]
    advantages = [[0.0, 1.0, 1.0, -1.0], [1.0, 1.0]]
    weights = [
        math.exp(p - q)
        for lp, sp, ad in zip(learner, samplers, advantages, strict=True)
        for p, q, a in zip(lp, sp, ad, strict=True)
        if a != 0
    ]
    coef = [min(w, 1.5) for w in weights]
    metrics = offpolicy_metrics([out])
    assert metrics["offpolicy/tokens"] == 5
    assert metrics["offpolicy/is_weight_mean"] == pytest.approx(sum(weights) / 5, rel=1e-5)
    assert metrics["offpolicy/is_weight_max"] == pytest.approx(max(weights), rel=1e-5)
    assert max(weights) > 1.5  # so the maximum is the one before clamping
    assert metrics["offpolicy/corrected_frac"] == pytest.approx(sum(w > 1.5 for w in weights) / 5)
    assert metrics["offpolicy/ess"] == pytest.approx(sum(coef) ** 2 / (5 * sum(c * c for c in coef)), rel=1e-5)
    assert metrics["offpolicy/sequences_masked_frac"] == 0.0


def test_the_statistics_of_several_calls_add_up_exactly() -> None:
    def output(metrics: dict[str, float]) -> tinker_types.ForwardBackwardOutput:
        return tinker_types.ForwardBackwardOutput(loss_fn_output_type="TensorData", loss_fn_outputs=[], metrics=metrics)

    one = {"offpolicy/tokens:sum": 2.0, "offpolicy/is_weight:sum": 3.0, "offpolicy/is_weight_max:max": 2.5}
    one |= {"offpolicy/corrected:sum": 1.0, "offpolicy/coef:sum": 2.0, "offpolicy/coef_sq:sum": 2.5}
    one |= {"offpolicy/sequences:sum": 1.0, "offpolicy/sequences_masked:sum": 0.0}
    two = {"offpolicy/tokens:sum": 2.0, "offpolicy/is_weight:sum": 1.0, "offpolicy/is_weight_max:max": 0.6}
    two |= {"offpolicy/corrected:sum": 2.0, "offpolicy/coef:sum": 0.0, "offpolicy/coef_sq:sum": 0.0}
    two |= {"offpolicy/sequences:sum": 1.0, "offpolicy/sequences_masked:sum": 1.0}
    metrics = offpolicy_metrics([output(one), output(two)])
    assert metrics == {
        "offpolicy/tokens": 4.0,
        "offpolicy/is_weight_mean": 1.0,
        "offpolicy/is_weight_max": 2.5,
        "offpolicy/corrected_frac": 0.75,
        "offpolicy/ess": 4.0 / (4 * 2.5),
        "offpolicy/sequences_masked_frac": 0.5,
    }
    assert offpolicy_metrics([output({"loss:sum": 1.0})]) == {}
