"""trio_rl.cli.flags and config_flags: Config's fields are the examples' flags, written once, in Config."""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from trio_rl import AsyncConfig, Config, FailFast
from trio_rl.cli import CommonArgs, field_docs, make_backend, make_config, parse_args
from trio_rl.cli.config_flags import NOT_FLAGS

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TINY: dict[str, Any] = {"d_model": 16, "n_layers": 1, "n_heads": 2, "progress": False}
WITH_CONFIG = ["arithmetic", "guess_number", "embedding", "smollm2_addition"]
STRUCTURED = NOT_FLAGS


def load(name: str) -> ModuleType:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


def help_entries(module: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """Each flag of the example's ``--help`` and what follows it, unwrapped onto one line."""
    monkeypatch.setenv("COLUMNS", "120")  # one column of option groups
    with pytest.raises(SystemExit) as stop:
        module.main(["--help"])
    assert stop.value.code == 0
    lines = [line.strip("│╭╮╰╯─").rstrip() for line in capsys.readouterr().out.splitlines()]
    entries = re.findall(r"^ {1,2}(--[a-z][a-z0-9-]*)(.*?)(?=^ {1,2}--|^\S|\Z)", "\n".join(lines), re.M | re.S)
    return {flag: " ".join(body.split()) for flag, body in entries}


def test_every_config_field_has_a_docstring_and_help_is_plain_text() -> None:
    docs = field_docs(Config)
    assert set(docs) == {f.name for f in dataclasses.fields(Config)}
    assert docs["learning_rate"] == "Adam learning rate"
    # Markup becomes what a terminal should show; a docstring over two lines becomes one.
    assert "``" not in "".join(docs.values()) and ":class:" not in "".join(docs.values())
    assert docs["rollout_error_tolerance"].startswith(
        "what a failed rollout does, as in tinker-cookbook 0.6.1: None (per base_model"
    )
    assert "(trio_rl.asyncio_bridge)" in docs["asyncio_bridge"] and "\n" not in docs["asyncio_bridge"]


@pytest.mark.parametrize("example", WITH_CONFIG)
def test_each_config_flag_shows_its_fields_docstring_as_help(
    example: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = load(example)
    entries = help_entries(module, monkeypatch, capsys)
    docs = field_docs(Config)
    for name in (f.name for f in dataclasses.fields(Config) if f.name not in STRUCTURED):
        flag = "--" + {"base_model": "model"}.get(name, name).replace("_", "-")
        default = getattr(module.CONFIG, name)
        assert f"{docs[name]} (default: {default})" in entries[flag], (flag, entries[flag])


@pytest.mark.parametrize("example", WITH_CONFIG)
def test_an_examples_config_is_the_default_of_its_flags(example: str) -> None:
    module = load(example)
    args = parse_args(module.Args, [])
    assert args.config == module.CONFIG
    # Each example departs from Config's defaults somewhere, and that is what a run gets.
    departs = {f.name for f in dataclasses.fields(Config) if getattr(module.CONFIG, f.name) != f.default}
    assert departs - {"log_path"}
    config = make_config(args)
    assert all(getattr(config, name) == getattr(module.CONFIG, name) for name in departs)


def test_an_overridden_default_is_what_help_shows(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    arithmetic = load("arithmetic")
    assert arithmetic.CONFIG.learning_rate == 1e-3 != Config(log_path="x").learning_rate
    entries = help_entries(arithmetic, monkeypatch, capsys)
    assert entries["--learning-rate"] == "FLOAT Adam learning rate (default: 0.001)"
    assert entries["--groups-per-batch"].endswith("(default: 16)")


def _changed(config: Config) -> dict[str, Any]:
    """The fields where ``config`` differs from Config's defaults, as config.json writes them."""
    base = Config(log_path="").to_json()
    return {name: value for name, value in config.to_json().items() if value != base[name]}


BEFORE: dict[str, dict[str, Any]] = {
    "arithmetic": {
        "log_path": "runs/arithmetic", "learning_rate": 1e-3, "max_tokens": 1, "max_steps": 600, "eval_every": 50,
        "save_every": 100, "save_on_cancel": True,
        "async_config": {"type": "AsyncConfig", "max_steps_off_policy": 1, "groups_per_batch": 16, "staleness": "oldest_first",
                         "loss_fn": None, "inflight_weights": False, "sampling_steps_ahead": None},
    },
    "guess_number": {
        "log_path": "runs/guess_number", "learning_rate": 2e-3, "loss_fn": "ppo", "max_tokens": 2, "max_steps": 150,
        "eval_every": 25, "save_every": 50, "save_on_cancel": True,
        "async_config": {"type": "AsyncConfig", "max_steps_off_policy": 1, "groups_per_batch": 8, "staleness": "oldest_first",
                         "loss_fn": "ppo", "inflight_weights": False, "sampling_steps_ahead": None},
    },
    "embedding": {
        "log_path": "runs/embedding", "learning_rate": 1e-3, "max_tokens": 1, "max_steps": 1000, "eval_every": 0,
        "save_every": 100, "save_on_cancel": True,
        "async_config": {"type": "AsyncConfig", "max_steps_off_policy": 1, "groups_per_batch": 16, "staleness": "oldest_first",
                         "loss_fn": None, "inflight_weights": False, "sampling_steps_ahead": None},
    },
    "smollm2_addition": {
        "log_path": "runs/smollm2_addition", "base_model": "SmolLM2-135M-Instruct", "learning_rate": 2e-4,
        "lora_rank": 8, "max_tokens": 6, "max_steps": 60, "eval_every": 5, "save_on_cancel": True,
    },
}  # fmt: skip
"""Each example's Config from no flags when its flags were declared apart from Config (commit 278de5e), but for
issue 20: the async mode carries the example's loss into AsyncConfig.loss_fn, and rollout_error_tolerance is
Config's default None (FailFast for these models, as before), and issue 22 adds AsyncConfig.inflight_weights
(default off), and issue 31 AsyncConfig.sampling_steps_ahead (None once constructed: K is max_steps_off_policy), and
issue 30: the async mode carries only a chosen loss (guess_number's ppo); Config's default leaves AsyncConfig.loss_fn
None, the backend's default."""


@pytest.mark.parametrize("example", WITH_CONFIG)
def test_each_examples_config_from_no_flags_is_the_one_it_had_before(example: str) -> None:
    module = load(example)
    args = parse_args(module.Args, [])
    overrides: dict[str, Any] = {}
    if hasattr(module, "build"):  # what run_example does
        _backend, tokenizer = make_backend(args, alphabet=module.ALPHABET)
        overrides = module.build(args, tokenizer).config_overrides
    assert _changed(make_config(args, **overrides)) == BEFORE[example]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--learning-rate", "abc"], "--learning-rate"),
        (["--max-steps", "None"], "--max-steps"),
        (["--loss-fn", "mse"], "--loss-fn"),
        (["--learning-rate", "0"], "error: learning_rate: must be > 0, got 0.0"),
        (["--top-p", "1.5"], "error: top_p: must be in (0, 1]"),
        (["--backend", "tinker"], "error: model: --backend tinker needs --model <base model name>"),
    ],
)
def test_a_bad_value_names_its_flag_and_exits_2(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arithmetic = load("arithmetic")
    try:
        code = arithmetic.main(["--log-path", str(tmp_path / "run"), *flags], **TINY)
    except SystemExit as stop:  # refused by the parser
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_flags_that_redeclare_a_config_field_are_refused() -> None:
    @dataclass
    class Redeclares(CommonArgs):
        learning_rate: float = 1e-3

    with pytest.raises(TypeError, match=r"Redeclares.learning_rate is a Config field, so already a flag"):
        parse_args(Redeclares, [])


def test_the_mode_flags_build_configs_structured_fields() -> None:
    args = parse_args(CommonArgs, ["--groups-per-batch", "4", "--max-steps-off-policy", "2"])
    config = make_config(args)
    assert config.async_config == AsyncConfig(2, 4, "oldest_first", loss_fn=None)  # the backend's default
    assert config.rollout_strategy() == FailFast()
    assert make_config(parse_args(CommonArgs, ["--mode", "sync"])).mode == "sync"
    # The command line's own Config: Config's defaults, a run folder, an end, and Ctrl-C saving.
    assert _changed(args.config) == {"log_path": "runs/example", "max_steps": 100, "save_on_cancel": True}


def test_without_a_default_config_the_fields_own_defaults_apply_and_log_path_is_required(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import tyro

    from trio_rl.cli import CONFIG_FLAGS

    @dataclass
    class Bare:
        config: Config

    with CONFIG_FLAGS:
        parsed = tyro.cli(Bare, args=["--log-path", "run", "--max-steps", "None", "--seed", "3"])
        assert parsed.config == Config(log_path="run", max_steps=None, seed=3)
        with pytest.raises(SystemExit) as stop:
            tyro.cli(Bare, args=[])
    assert stop.value.code == 2 and "--log-path" in capsys.readouterr().err
