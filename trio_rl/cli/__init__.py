"""Command-line plumbing shared by the examples: flags (tyro), backend, progress, sinks, Ctrl-C.

An example puts its configuration at the top, as a :class:`~trio_rl.Config` that differs
from Config's defaults where the example needs it, declares its own flags as a dataclass
deriving from :class:`CommonArgs` (each field is a ``--flag``; its docstring is the help;
every plain field of the Config is a flag too), and ends with::

    def build(args: Args, tokenizer: LazyTokenizer) -> Experiment:
        ...build the dataset and evaluators from the tokenizer...
        return Experiment(dataset, evaluators, curve_keys=("eval/accuracy",))

    def main(argv=None, **defaults) -> int:
        return run_example(Args, build, argv, alphabet=ALPHABET, description=..., **defaults)

:func:`run_example` parses the flags, builds the :class:`~trio_rl.Config` and checks it,
and runs :func:`trio_rl.train` under ``trio.run`` (:func:`run_cli`) with a progress bar
on stderr and the ``--log-to`` sinks, both fed live from :attr:`RunHandle.metrics`.
It writes ``reward_curve.png`` into the run folder at the end and on Ctrl-C. Ctrl-C is
a clean stop: the run's scope is cancelled, the trainer saves the last completed step
(``Config.save_on_cancel``), one line says where that checkpoint is, and the exit code
is 130. An invalid configuration prints its :class:`ConfigError` and exits with 2,
whether it is found while parsing, before the run, or inside it.

The modules, one concept each: :mod:`.flags` (the flags and the Config they make),
:mod:`.config_flags` (Config's fields as flags), :mod:`.backend` (``--backend``),
:mod:`.signals` (Ctrl-C, SIGTERM and the exit codes), :mod:`.reporting` (the last line,
``error.log``), :mod:`.run` (:func:`run_cli`, :func:`run_example`), :mod:`.progress`
and :mod:`.plotting`.
"""

from __future__ import annotations

from .backend import LazyTokenizer, make_backend
from .config_flags import CONFIG_FLAGS, field_docs
from .flags import CommonArgs, make_config, parse_args
from .reporting import DEBUG_ENV, ERROR_LOG, config_error_leaves
from .run import Experiment, Reporting, run_cli, run_example
from .signals import (
    EXIT_CONFIG_ERROR,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    STOP_SIGNALS,
    exit_quietly_on_stop_signals,
)

__all__ = [
    "CONFIG_FLAGS",
    "DEBUG_ENV",
    "ERROR_LOG",
    "EXIT_CONFIG_ERROR",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "STOP_SIGNALS",
    "CommonArgs",
    "Experiment",
    "LazyTokenizer",
    "Reporting",
    "config_error_leaves",
    "exit_quietly_on_stop_signals",
    "field_docs",
    "make_backend",
    "make_config",
    "parse_args",
    "run_cli",
    "run_example",
]
