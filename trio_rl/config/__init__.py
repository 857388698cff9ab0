"""Run configuration: the knobs of tinker-cookbook's RL loop, checked before any work starts.

The package's layers, each importing only those before it: :mod:`~trio_rl.config.checks`
(the rules values obey), :mod:`~trio_rl.config.as_json` (``config.json``),
:mod:`~trio_rl.config.modes` (``StreamMinibatchConfig``, ``AsyncConfig``),
:mod:`~trio_rl.config.run_config` (``Config``). Configuration imports no loop
module: the schedule a configuration selects is built on the loop's side
(:func:`trio_rl.loop.selected_schedule.schedule_for`).
"""

from .checks import DEFAULT_LOSS_FN, LOSS_FNS
from .modes import STALENESS_POLICIES, AsyncConfig, Staleness, StreamMinibatchConfig
from .run_config import Config, check_inflight_on_backend, check_loss_on_backend

__all__ = [
    "DEFAULT_LOSS_FN",
    "LOSS_FNS",
    "STALENESS_POLICIES",
    "AsyncConfig",
    "Config",
    "Staleness",
    "StreamMinibatchConfig",
    "check_inflight_on_backend",
    "check_loss_on_backend",
]
