#!/usr/bin/env bash
# The one entry point for the integration tests (called by .ci/run).
#
#   1. set up (or reuse) the integration venv: skyrl 0.3.0 server + trio_rl on tinker 0.24.1;
#   2. type-check tests/integration with mypy --strict in that venv (skyrl, tinker 0.24.1);
#   3. run TinkerBackend's unit tests in that venv (proves the 0.24.1 end of the supported range);
#   4. run `pytest -m integration tests/integration` against a real SkyRL server,
#      which the session fixture starts and always stops.
#
# Exits non-zero if anything fails (mypy included; the tests run even when it fails), and
# also if a stage ran no test at all (a silently skipped suite must not look green).
#
# Environment: SKYRL_VENV (see setup_env.sh), SKYRL_KEEP_WORKDIR=1 (keep server
# log/model/db), INTEGRATION_TIMEOUT_S (default 900: hard cap on the server tests),
# extra pytest arguments can be passed as arguments to this script (integration stage only).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# REPO, junit_counts
. "$HERE/../venv_tools.sh"
VENV="${SKYRL_VENV:-$REPO/.skyvenv}"
export SKYRL_VENV="$VENV"
TIMEOUT_S="${INTEGRATION_TIMEOUT_S:-900}"

# Nothing here may reach the hub or send telemetry; JAX must not look for GPUs.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TINKER_TELEMETRY=0 JAX_PLATFORMS=cpu

REPORTS="$(mktemp -d "${TMPDIR:-/tmp}/trio_rl_integration_reports.XXXXXX")"
trap 'rm -rf "$REPORTS"' EXIT

total_start=$(date +%s)
bash "$HERE/setup_env.sh"
setup_s=$(( $(date +%s) - total_start ))

cd "$REPO"
status=0
summary=()
all_passed=0 all_failed=0 all_skipped=0

# run_stage NAME TIMEOUT PYTEST_ARGS...: run pytest, record pass/fail/skip counts
# from its JUnit report, and fail the stage if nothing actually ran.
run_stage() {
    local name="$1" timeout_s="$2"
    shift 2
    local xml="$REPORTS/$name.xml" start rc=0
    start=$(date +%s)
    echo "=== $name: pytest $*" >&2
    # SIGTERM on timeout: the session fixture turns it into an interrupt and
    # stops the server; SIGKILL 60 s later if even that hangs.
    timeout --signal=TERM --kill-after=60 "$timeout_s" \
        "$VENV/bin/python" -m pytest --junitxml="$xml" --durations=0 "$@" || rc=$?
    local elapsed=$(( $(date +%s) - start ))
    local passed failed skipped
    read -r passed failed skipped < <(junit_counts "$xml")
    all_passed=$(( all_passed + passed )) all_failed=$(( all_failed + failed )) all_skipped=$(( all_skipped + skipped ))
    summary+=("$name: $passed passed, $failed failed, $skipped skipped in ${elapsed} s (pytest exit $rc)")
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then
        echo "=== $name: timed out after ${timeout_s} s" >&2
    fi
    if [[ $rc -ne 0 ]]; then
        status=1
    elif [[ $passed -eq 0 ]]; then
        echo "=== $name: no test ran; counting that as a failure" >&2
        status=1
    fi
}

# The files here import each other by bare name (conftest puts this folder on sys.path), hence
# MYPYPATH. What they import is read for its types, not reported (--follow-imports=silent): .ci/lint
# checks trio_rl in the venv that has its extras (this one has other peft and transformers, no wandb),
# and tiny_model, which every suite imports as tests.integration.tiny_model (so not by its bare name here).
echo "=== mypy: --strict tests/integration" >&2
mypy_start=$(date +%s) mypy_rc=0
MYPYPATH="$HERE" "$VENV/bin/python" -m mypy --strict --follow-imports=silent --cache-dir "$VENV/.mypy_cache" \
    tests/integration --exclude 'tests/integration/tiny_model\.py$' || mypy_rc=$?
summary+=("mypy: exit $mypy_rc in $(( $(date +%s) - mypy_start )) s")
[[ $mypy_rc -eq 0 ]] || status=1

run_stage tinker-unit 300 -q tests/test_tinker_*.py
run_stage integration "$TIMEOUT_S" -m integration -v tests/integration "$@"

echo
echo "setup: ${setup_s} s"
for line in "${summary[@]}"; do
    echo "$line"
done
echo "total: $(( $(date +%s) - total_start )) s"
# Last, alone on its line, in the form CI tools read as a test summary.
echo "integration: $all_passed passed, $all_failed failed, $all_skipped skipped"
exit "$status"
