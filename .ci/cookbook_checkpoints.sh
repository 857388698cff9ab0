#!/usr/bin/env bash
# checkpoints.jsonl both ways with the real tinker-cookbook 0.6.1: its
# get_last_checkpoint reads a trio_rl run, and trio_rl resumes from a row the
# cookbook's own save_checkpoint_async wrote. The cookbook's checkpoint_utils
# needs only tinker, so its venv is small; it is kept between runs.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
venv=${COOKBOOK_VENV:-.ci/.cookbook-venv}
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --no-deps tinker-cookbook==0.6.1
    "$venv/bin/pip" install -q tinker==0.38.0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/python tests/cookbook_compat/trio_side.py write "$work/trio_run"
"$venv/bin/python" tests/cookbook_compat/cookbook_side.py read "$work/trio_run"
"$venv/bin/python" tests/cookbook_compat/cookbook_side.py write "$work/cookbook_run"
.venv/bin/python tests/cookbook_compat/trio_side.py resume "$work/cookbook_run"
echo "cookbook checkpoint round trip: $(( $(date +%s) - start )) s"
