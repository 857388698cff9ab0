"""The tinker-cookbook suite runs only where tinker-cookbook is installed (tests/cookbook/run.sh).

In the main venv these modules are not collected at all: they import the
cookbook at the top. run.sh fails if this suite ran no test, so a missing
cookbook cannot pass silently there.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("tinker_cookbook") is None:
    collect_ignore_glob = ["test_*.py"]
