"""The command-line bugs of issue 12, each reproduced through an example's ``main``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import load_example
from trio_rl import Config, KLReferenceConfig, TerminationRewardPolicy
from trio_rl.cli.config_flags import NOT_FLAGS
from trio_rl.config import LOSS_FNS, AsyncConfig, StreamMinibatchConfig

TINY: dict[str, Any] = {"d_model": 16, "n_layers": 1, "n_heads": 2}


def exit_code(main: Callable[..., int], argv: list[str], **overrides: Any) -> int:
    """What the process would exit with: main's return value, or the code of a SystemExit."""
    try:
        return main(argv, **overrides)
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 1


def test_an_unknown_loss_names_the_choices_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arithmetic = load_example("arithmetic")
    assert exit_code(arithmetic.main, ["--log-path", str(tmp_path), "--loss-fn", "bogus"], **TINY) == 2
    err = capsys.readouterr().err
    assert "bogus" in err and "importance_sampling" in err and "cispo" in err
    assert "Trio nursery" not in err and "Traceback" not in err


def test_an_unknown_mode_exits_2_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arithmetic = load_example("arithmetic")
    assert exit_code(arithmetic.main, ["--log-path", str(tmp_path), "--mode", "foo"], **TINY) == 2
    err = capsys.readouterr().err
    assert "foo" in err and "sync" in err and "stream" in err
    assert "Traceback" not in err


def test_an_invalid_value_checked_by_the_config_prints_its_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arithmetic = load_example("arithmetic")
    argv = ["--log-path", str(tmp_path), "--mode", "stream", "--groups-per-batch", "4", "--num-minibatches", "3"]
    assert exit_code(arithmetic.main, argv, **TINY) == 2
    err = capsys.readouterr().err
    assert (
        "stream_minibatch_config.groups_per_batch: 4 is not divisible by stream_minibatch_config.num_minibatches=3"
        in err
    )
    assert "Trio nursery" not in err and "Traceback" not in err
    assert not (tmp_path / "metrics.jsonl").exists()


def _progress_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if re.search(r"\b3/3\b", line) and "reward" in line]


def test_no_progress_turns_the_progress_lines_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arithmetic = load_example("arithmetic")
    argv = ["--max-steps", "3", "--groups-per-batch", "2", "--group-size", "2", "--mode", "sync", "--eval-every", "0"]
    assert arithmetic.main([*argv, "--log-path", str(tmp_path / "on")], **TINY) == 0
    assert len(_progress_lines(capsys.readouterr().err)) == 1  # not a terminal: a plain line at the last step
    assert arithmetic.main([*argv, "--log-path", str(tmp_path / "off"), "--no-progress"], **TINY) == 0
    err = capsys.readouterr().err
    assert _progress_lines(err) == [] and "done: 3 steps" in err


def _help_text(module: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    # One column of boxes: tyro sets the option groups side by side from 130 columns.
    monkeypatch.setenv("COLUMNS", "120")
    assert exit_code(module.main, ["--help"]) == 0
    text = capsys.readouterr().out
    # Keep the words and the indentation, not the box drawing (on a terminal): a flag
    # starts a line after a space or two, its wrapped help is indented further.
    return "\n".join(line.strip("│╭╮╰╯─").rstrip() for line in text.splitlines())


STRUCTURED = NOT_FLAGS
"""Config's fields that are no flag of their own: the run's flags build them (--mode, --error-strategy,
--kl-reference-model), or, for termination, only code sets them."""


def flag_names(args: type) -> list[str]:
    """Every flag an example's Args should offer: its own fields, each Config field but the structured ones,
    and each AsyncConfig field but the two other flags set (--groups-per-batch, --loss-fn)."""
    # A tyro.conf.Suppress field is no flag: parse_args sets it (loss_fn_on_command_line).
    own = [
        f.name
        for f in dataclasses.fields(args)
        if f.name not in ("config", "async_flags") and "Suppress[" not in str(f.type)
    ]
    of_config = [
        {"base_model": "model"}.get(f.name, f.name) for f in dataclasses.fields(Config) if f.name not in STRUCTURED
    ]
    of_async = [f.name for f in dataclasses.fields(AsyncConfig) if f.name not in ("groups_per_batch", "loss_fn")]
    return ["--" + name.replace("_", "-") for name in own + of_config + of_async]


@pytest.mark.parametrize("example", ["guess_number", "arithmetic"])
def test_help_shows_help_and_default_for_every_flag(
    example: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = load_example(example)
    text = _help_text(module, monkeypatch, capsys)
    flags = flag_names(module.Args)
    # No other flag either (no --config.* prefix, no subcommand for a structured field).
    assert set(re.findall(r"^ {1,2}(--[a-z][a-z0-9-]*)", text, re.MULTILINE)) == set(flags)
    for flag in flags:
        entry = re.search(rf"^ {{1,2}}{re.escape(flag)}\b(.*?)(?=^ {{1,2}}--|\Z)", text, re.MULTILINE | re.DOTALL)
        assert entry is not None, f"{flag} missing from --help"
        body = " ".join(entry.group(1).split())  # unwrapped
        assert "(default: " in body, f"{flag} shows no default"
        words = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b[A-Z]+\b|\(default: [^)]*\)|,|--no-[a-z-]+", " ", body)
        assert re.search(r"[a-z]{3,}", words), f"{flag} has no help text: {body!r}"


def test_enum_like_flags_offer_their_choices(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _help_text(load_example("guess_number"), monkeypatch, capsys)
    assert "{sync,stream,async}" in text
    assert "{oldest_first,pace,requeue}" in text
    # The losses Config.validate accepts, as the installed tinker SDK lists them.
    assert "{" + ",".join(LOSS_FNS) + "}" in text
    assert {"importance_sampling", "ppo", "cispo", "dro", "cross_entropy"} <= set(LOSS_FNS)


NON_DEFAULT_FLAGS: list[tuple[list[str], str, Any]] = [
    (["--log-path", "elsewhere"], "log_path", Path("elsewhere")),
    (["--model", "org/model"], "base_model", "org/model"),
    (["--lora-rank", "8"], "lora_rank", 8),
    (["--learning-rate", "0.5"], "learning_rate", 0.5),
    (["--adam-beta1", "0.8"], "adam_beta1", 0.8),
    (["--adam-beta2", "0.9"], "adam_beta2", 0.9),
    (["--adam-eps", "1e-6"], "adam_eps", 1e-6),
    (["--weight-decay", "0.1"], "weight_decay", 0.1),
    (["--grad-clip-norm", "1.5"], "grad_clip_norm", 1.5),
    (["--max-tokens", "3"], "max_tokens", 3),
    (["--temperature", "0.7"], "temperature", 0.7),
    (["--top-k", "5"], "top_k", 5),
    (["--top-p", "0.9"], "top_p", 0.9),
    (["--loss-fn", "cispo"], "loss_fn", "cispo"),
    (["--loss-fn-config", "clip_low_threshold", "0.8"], "loss_fn_config", {"clip_low_threshold": 0.8}),
    (["--num-substeps", "2"], "num_substeps", 2),
    (["--eval-every", "3"], "eval_every", 3),
    (["--save-every", "4"], "save_every", 4),
    (["--eval-timeout", "30"], "eval_timeout", 30.0),
    (["--max-steps", "5"], "max_steps", 5),
    (["--remove-constant-reward-groups"], "remove_constant_reward_groups", True),
    (["--kl-penalty-coef", "0.1"], "kl_penalty_coef", 0.1),
    (["--kl-discount-factor", "0.5"], "kl_discount_factor", 0.5),
    (["--kl-penalty-coef", "0.1", "--kl-reference-model", "base"], "kl_reference_config", KLReferenceConfig("base")),
    (["--seed", "7"], "seed", 7),
    (["--num-workers", "3"], "num_workers", 3),
    (["--error-strategy", "retry", "--max-retries", "4"], "rollout_error_tolerance", "RetryOnFailure(max_retries=4"),
    (["--mode", "stream", "--groups-per-batch", "8", "--num-minibatches", "4"], "stream_minibatch_config",
     StreamMinibatchConfig(8, 4)),
    (["--mode", "async", "--max-steps-off-policy", "2", "--staleness", "pace"], "async_config",
     AsyncConfig(2, 8, "pace", loss_fn=None)),  # no --loss-fn: the backend's default
    (["--mode", "async", "--loss-fn", "cispo"], "async_config", AsyncConfig(1, 8, loss_fn="cispo")),
    (["--load-checkpoint-path", "/tmp/state"], "load_checkpoint_path", "/tmp/state"),
    (["--resume"], "resume", True),
    (["--overwrite"], "overwrite", True),
    (["--asyncio-bridge", "never"], "asyncio_bridge", "never"),
    (["--no-save-on-cancel"], "save_on_cancel", False),
    (["--cancel-save-timeout", "5"], "cancel_save_timeout", 5.0),
    (["--num-epochs", "3"], "num_epochs", 3),
    (["--compute-post-kl"], "compute_post_kl", True),
    (["--rolling-save-every", "2"], "rolling_save_every", 2),
    (["--zero-reward-on-limit"], "termination", TerminationRewardPolicy(zero_reward_on_limit=True)),
    (["--transcripts-every", "10"], "transcripts_every", 10),
    (["--transcript-groups", "2"], "transcript_groups", 2),
    (["--trace"], "trace", True),
    (["--timeline-every", "5"], "timeline_every", 5),
    (["--stall-warning-s", "30"], "stall_warning_s", 30.0),
]  # fmt: skip


def test_every_config_field_has_a_flag() -> None:
    assert {name for _, name, _ in NON_DEFAULT_FLAGS} == {f.name for f in dataclasses.fields(Config)}


@pytest.mark.parametrize(("flags", "name", "expected"), NON_DEFAULT_FLAGS, ids=[n for _, n, _ in NON_DEFAULT_FLAGS])
def test_a_flag_reaches_its_config_field(flags: list[str], name: str, expected: Any) -> None:
    from trio_rl.cli import CommonArgs, make_config, parse_args

    config = make_config(parse_args(CommonArgs, ["--groups-per-batch", "8", *flags]))
    value = getattr(config, name)
    if isinstance(expected, str) and name == "rollout_error_tolerance":
        assert repr(value).startswith(expected)
    else:
        assert value == expected
    assert Config.from_json(config.to_json()) == config


def test_the_embedding_host_prints_a_config_error_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    embedding = load_example("embedding")
    argv = ["--log-path", str(tmp_path), "--mode", "stream", "--groups-per-batch", "4", "--num-minibatches", "3"]
    assert embedding.main(argv, **TINY) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: stream_minibatch_config.groups_per_batch: 4 is not divisible") and "Traceback" not in err
    )


@pytest.mark.parametrize("flags", [["--group-size", "0"], ["--group-size", "-3"], ["--groups-per-batch", "0"]])
def test_a_group_size_below_one_is_refused_with_exit_2(
    flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It used to train nothing and exit 0 ("last reward nan").
    arithmetic = load_example("arithmetic")
    code = arithmetic.main(["--log-path", str(tmp_path / "run"), *flags])
    assert code == 2
    err = capsys.readouterr().err
    assert "must be at least 1" in err and "Traceback" not in err
