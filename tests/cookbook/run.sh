#!/usr/bin/env bash
# The tinker-cookbook suite (called by .ci/run): tinker-cookbook 0.6.1's own
# envs, datasets and evaluators trained through trio_rl.train.
#
#   1. set up (or reuse) its venv: tinker-cookbook 0.6.1 + trio_rl + trio-asyncio (setup_env.sh);
#   2. set up (or reuse) the skyrl 0.4.0 server venv (tests/integration/setup_skyrl04_env.sh) that
#      test_cookbook_skyrl_server.py trains a recipe against, and name its python in COOKBOOK_SKYRL_PYTHON;
#   3. type-check tests/cookbook and bench/vs_cookbook with mypy --strict in the first venv, where
#      tinker-cookbook's classes are real (.ci/lint's venv has no cookbook: there they are Any);
#   4. run pytest on tests/cookbook in the first venv.
#
# Exits non-zero if mypy reports an error, if a test fails, if the suite runs past
# COOKBOOK_TIMEOUT_S (default 900), and if no test passed (a suite that silently collected
# nothing must not look green). The tests run even when mypy fails. Extra arguments go to pytest.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# REPO, junit_counts
. "$HERE/../venv_tools.sh"
VENV="${COOKBOOK_VENV:-$REPO/.cookbook-venv}"
export COOKBOOK_VENV="$VENV"
TIMEOUT_S="${COOKBOOK_TIMEOUT_S:-900}"

# Nothing here may reach the hub or send telemetry.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TINKER_TELEMETRY=0

start=$(date +%s)
bash "$HERE/setup_env.sh"
bash "$REPO/tests/integration/setup_skyrl04_env.sh"
export COOKBOOK_SKYRL_PYTHON="${SKYRL04_VENV:-$REPO/.skyvenv04}/bin/python"
setup_s=$(( $(date +%s) - start ))

cd "$REPO"
# The cache lives with the venv it describes (.ci/lint's venv has other packages under the same names).
mypy_start=$(date +%s) mypy_rc=0
"$VENV/bin/python" -m mypy --strict --cache-dir "$VENV/.mypy_cache" tests/cookbook bench/vs_cookbook || mypy_rc=$?
mypy_s=$(( $(date +%s) - mypy_start ))

report="$(mktemp "${TMPDIR:-/tmp}/trio_rl_cookbook.XXXXXX.xml")"
trap 'rm -f "$report"' EXIT
rc=0
timeout --signal=TERM --kill-after=30 "$TIMEOUT_S" \
    "$VENV/bin/python" -m pytest -p no:cacheprovider -v --junitxml="$report" tests/cookbook "$@" || rc=$?

read -r passed failed skipped < <(junit_counts "$report")

echo "cookbook suite: setup ${setup_s} s, mypy ${mypy_s} s (exit $mypy_rc), total $(( $(date +%s) - start )) s (pytest exit $rc)"
if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    echo "cookbook suite: timed out after ${TIMEOUT_S} s" >&2
fi
if [[ $rc -eq 0 && $passed -eq 0 ]]; then
    echo "cookbook suite: no test ran; counting that as a failure" >&2
    rc=1
fi
if [[ $mypy_rc -ne 0 ]]; then
    echo "cookbook suite: mypy --strict found errors (above); counting that as a failure" >&2
    [[ $rc -ne 0 ]] || rc=1
fi
echo "cookbook: $passed passed, $failed failed, $skipped skipped"
exit "$rc"
