# Shell helpers shared by the scripts that build a venv of their own
# (tests/integration/setup_env.sh, tests/cookbook/setup_env.sh,
# bench/vs_cookbook/setup_env.sh). Source it after setting VENV.

log() { echo "setup_env: $*" >&2; }

# pip prints one "WARNING: Location 'file:///...' is ignored" line per package
# because of this machine's local index; they are harmless and drown real errors.
quiet_pip() {
    # With pipefail the pipeline's status is pip's: the filter itself never fails.
    local status=0
    "$VENV/bin/python" -m pip "$@" 2>&1 | { grep -v "WARNING: Location" || true; } || status=$?
    return "$status"
}

# The requirement pyproject.toml's lint extra names for a package ("mypy>=1.11"): a suite that
# type-checks in its own venv installs the checker .ci/lint installs. Needs REPO and VENV.
lint_requirement() {
    "$VENV/bin/python" - "$REPO/pyproject.toml" "$1" <<'PY'
import re
import sys
import tomllib

with open(sys.argv[1], "rb") as file:
    lint = tomllib.load(file)["project"]["optional-dependencies"]["lint"]
(requirement,) = [r for r in lint if re.split(r"[\s<>=!~\[;]", r, maxsplit=1)[0] == sys.argv[2]]
print(requirement)
PY
}
