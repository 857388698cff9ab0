#!/usr/bin/env bash
# trio_rl against tinker-cookbook 0.6.1's RL loop, side by side (see run.py for what is measured).
#
#   bash bench/vs_cookbook/run.sh            # cells a-d, sync and async K=1, 3 repetitions (7-9 min here)
#   bash bench/vs_cookbook/run.sh --quick    # 5x fewer steps, 2 repetitions (~2 min)
#   bash bench/vs_cookbook/run.sh --longtail # the long-tail cell, K = 1, 2, 4 (--steps 20 for a short one)
#
# Builds what is missing first: the repository's .venv (as the README's test command does)
# for the trio_rl side, and .vs-cookbook-venv (setup_env.sh) for the cookbook side.
# Any failure stops the run with a non-zero exit.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
cd "$REPO"

# Nothing here may reach the hub or send telemetry.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TINKER_TELEMETRY=0

if ! .venv/bin/python -c "import trio_rl, tinker, trio" 2>/dev/null; then
    echo "run.sh: building .venv for the trio_rl side" >&2
    python3 -m venv .venv
    .venv/bin/pip install -q torch==2.13.0 -e '.[test]' 2>&1 | { grep -v "WARNING: Location" || true; }
    .venv/bin/python -c "import trio_rl, tinker, trio" || { echo "run.sh: .venv does not import trio_rl" >&2; exit 1; }
fi
bash "$HERE/setup_env.sh"

exec .venv/bin/python "$HERE/run.py" "$@"
