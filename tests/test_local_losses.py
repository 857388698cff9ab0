"""The local losses against hand-computed values, and through forward_backward."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tinker import types as tinker_types

from tests.local_helpers import SMALL_CONFIG, local_training_client
from trio_rl import _tinker_compat as compat
from trio_rl.backends.local import CharTokenizer, LocalBackend
from trio_rl.backends.local.losses import check_loss_fn, cispo, cross_entropy, importance_sampling, ppo

LP = [-1.0, -0.5, -2.0]
SAMPLING = [-1.1, -1.0, -1.0]  # ratios e^0.1, e^0.5, e^-1.0: inside, above and below [0.8, 1.2]
ADV = [2.0, 1.0, -1.0]


def _inputs(**extra: list[float]) -> dict[str, torch.Tensor]:
    base = {
        "logprobs": torch.tensor(SAMPLING, dtype=torch.float64),
        "advantages": torch.tensor(ADV, dtype=torch.float64),
    }
    base.update({k: torch.tensor(v, dtype=torch.float64) for k, v in extra.items()})
    return base


def _lp() -> torch.Tensor:
    return torch.tensor(LP, dtype=torch.float64, requires_grad=True)


def test_cross_entropy_is_weighted_negative_logprob() -> None:
    lp = _lp()
    loss = cross_entropy(lp, {"weights": torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)}, {})
    assert loss.tolist() == [1.0, 0.0, 1.0]
    loss.sum().backward()  # type: ignore[no-untyped-call]
    assert lp.grad is not None and lp.grad.tolist() == [-1.0, 0.0, -0.5]


def test_importance_sampling_matches_hand_values() -> None:
    lp = _lp()
    loss = importance_sampling(lp, _inputs(), {})
    ratios = [math.exp(a - b) for a, b in zip(LP, SAMPLING, strict=True)]
    expected = [-r * a for r, a in zip(ratios, ADV, strict=True)]
    assert loss.tolist() == pytest.approx(expected, rel=1e-12)
    loss.sum().backward()  # type: ignore[no-untyped-call]
    # d(-r A)/d lp = -r A
    assert lp.grad is not None and lp.grad.tolist() == pytest.approx(expected, rel=1e-12)


def test_ppo_clips_per_token() -> None:
    lp = _lp()
    loss = ppo(lp, _inputs(), {})
    r = [math.exp(a - b) for a, b in zip(LP, SAMPLING, strict=True)]
    # token 0: r=1.105 inside -> -r*2; token 1: r=1.65, A>0 -> clipped to 1.2;
    # token 2: r=0.37, A<0 -> min(-0.37, -0.8) = -0.8 (clipped side wins).
    expected = [-r[0] * 2.0, -1.2 * 1.0, 0.8]
    assert loss.tolist() == pytest.approx(expected, rel=1e-12)
    loss.sum().backward()  # type: ignore[no-untyped-call]
    # clipped tokens carry no gradient
    assert lp.grad is not None and lp.grad.tolist() == pytest.approx([-r[0] * 2.0, 0.0, 0.0], rel=1e-12)


def test_ppo_unclipped_side_wins_when_pessimistic() -> None:
    # A>0 with r below the low bound: min(r*A, 0.8*A) = r*A, so it keeps its gradient.
    lp = torch.tensor([-2.0], dtype=torch.float64, requires_grad=True)
    inputs = {
        "logprobs": torch.tensor([-1.0], dtype=torch.float64),
        "advantages": torch.tensor([1.0], dtype=torch.float64),
    }
    loss = ppo(lp, inputs, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1})
    assert loss.item() == pytest.approx(-math.exp(-1.0))
    loss.backward()  # type: ignore[no-untyped-call]
    assert lp.grad is not None and lp.grad.item() == pytest.approx(-math.exp(-1.0))


def test_cispo_uses_clipped_ratio_without_gradient() -> None:
    lp = _lp()
    loss = cispo(lp, _inputs(), {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    r = [math.exp(a - b) for a, b in zip(LP, SAMPLING, strict=True)]
    coef = [r[0], 1.2, 0.8]
    expected = [-c * lp * a for c, lp, a in zip(coef, LP, ADV, strict=True)]
    assert loss.tolist() == pytest.approx(expected, rel=1e-12)
    loss.sum().backward()  # type: ignore[no-untyped-call]
    assert lp.grad is not None and lp.grad.tolist() == pytest.approx(
        [-c * a for c, a in zip(coef, ADV, strict=True)], rel=1e-12
    )


def test_rl_losses_apply_weights_when_given() -> None:
    w = [1.0, 0.0, 1.0]
    for fn in (importance_sampling, ppo, cispo):
        plain = fn(_lp(), _inputs(), {})
        masked = fn(_lp(), _inputs(weights=w), {})
        assert masked.tolist() == pytest.approx([plain[0].item(), 0.0, plain[2].item()])


def test_check_loss_fn_rejects_unknown() -> None:
    with pytest.raises(ValueError, match="does not implement"):
        check_loss_fn("gspo", None)
    with pytest.raises(ValueError, match="not used"):
        check_loss_fn("cross_entropy", {"clip_low_threshold": 0.5})
    with pytest.raises(ValueError):
        check_loss_fn("ppo", {"clip_low_threshold": 1.5, "clip_high_threshold": 1.2})


async def test_forward_backward_reports_summed_losses(tmp_path: Path) -> None:
    tok = CharTokenizer("abc")
    async with local_training_client(tmp_path, deadline_s=30, model_config=SMALL_CONFIG, tokenizer=tok) as (_, client):
        seqs = [tok.encode("abcab"), tok.encode("ca")]
        ce = [
            tinker_types.Datum(
                model_input=tinker_types.ModelInput.from_ints(s[:-1]),
                loss_fn_inputs={"target_tokens": compat.tensor(s[1:], "int64"), "weights": compat.tensor([1.0] * (len(s) - 1), "float32")},
            )
            for s in seqs
        ]
        out = await (await client.forward_backward(ce, "cross_entropy")).result()
        lps = [o["logprobs"].to_numpy() for o in out.loss_fn_outputs]
        assert [len(x) for x in lps] == [4, 1]
        assert out.metrics["loss:sum"] == pytest.approx(-sum(float(x.sum()) for x in lps), rel=1e-5)
        # On-policy importance sampling: ratio 1, so the loss is -sum(advantages).
        rl = [
            tinker_types.Datum(
                model_input=d.model_input,
                loss_fn_inputs={
                    "target_tokens": d.loss_fn_inputs["target_tokens"],
                    "logprobs": lp.tolist(),
                    "advantages": compat.tensor([0.5] * len(lp), "float32"),
                },
            )
            for d, lp in zip(ce, lps, strict=True)
        ]
        for loss_fn in ("importance_sampling", "ppo", "cispo"):
            out = await (await client.forward_backward(rl, loss_fn)).result()
            expected = -2.5 if loss_fn != "cispo" else -0.5 * sum(float(x.sum()) for x in lps)
            assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5), loss_fn
            assert set(out.loss_fn_outputs[0]) == {"logprobs", "elementwise_loss"}


def test_dro_matches_the_published_formula() -> None:
    from trio_rl.backends.local.losses import dro

    lp = _lp()
    loss = dro(lp, _inputs(), {"beta": 0.5})
    # -(lp * A - beta / 2 * (lp - sampling)^2)
    expected = [-(a * adv - 0.25 * (a - s) ** 2) for a, s, adv in zip(LP, SAMPLING, ADV, strict=True)]
    assert loss.tolist() == pytest.approx(expected, rel=1e-12)
    loss.sum().backward()  # type: ignore[no-untyped-call]
    # d/dlp = -A + beta * (lp - sampling)
    grads = [-adv + 0.5 * (a - s) for a, s, adv in zip(LP, SAMPLING, ADV, strict=True)]
    assert lp.grad is not None and lp.grad.tolist() == pytest.approx(grads, rel=1e-12)
    with pytest.raises(ValueError, match="needs loss_fn_config"):
        check_loss_fn("dro", None)


async def test_a_loss_local_backend_lacks_is_rejected_before_work_naming_the_backends(tmp_path: Path) -> None:
    from trio_rl import Config, ConfigError, train
    from trio_rl.testing import FakeDataset

    async with LocalBackend(log_dir=tmp_path / "backend") as backend:
        config = Config(log_path=tmp_path / "run", loss_fn="gspo")
        with pytest.raises(
            ConfigError, match=r"does not implement loss_fn='gspo'.*LocalBackend.*TinkerBackend"
        ) as info:
            await train(config, dataset=FakeDataset(1, 1), backend=backend)
    assert info.value.field == "loss_fn"
    assert not (tmp_path / "run").exists()


def test_every_loss_of_the_sdk_is_accepted_by_the_configuration(tmp_path: Path) -> None:
    from typing import get_args

    from trio_rl import Config

    for loss in get_args(tinker_types.LossFnType):
        if loss != "custom":
            Config(log_path=tmp_path, loss_fn=loss).validate()
