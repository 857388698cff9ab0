# Shell helpers shared by the scripts that build a venv of their own
# (tests/integration/setup_env.sh and setup_skyrl04_env.sh, tests/cookbook/setup_env.sh,
# bench/vs_cookbook/setup_env.sh) and by the suites that run in one (tests/integration/run.sh,
# tests/cookbook/run.sh). Sourcing it sets REPO, the checkout it is in; the functions need VENV.

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

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

# venv_has WANT...: exit 0 when $VENV's python has every WANT: "name==version" installed at exactly
# that version (torch's local build suffix, as in "+cpu", not counted), "name" installed at all, and
# "trio_rl-from-this-checkout": trio_rl imported from REPO (CI clones the repository into a fresh
# folder, so an editable install left by an earlier checkout must not count).
venv_has() {
    [[ -x "$VENV/bin/python" ]] || return 1
    "$VENV/bin/python" - "$REPO" "$@" <<'PY' 2>/dev/null
import sys
from importlib import metadata
from pathlib import Path

repo, *wants = sys.argv[1:]
for want in wants:
    if want == "trio_rl-from-this-checkout":
        import trio_rl

        if not Path(trio_rl.__file__).resolve().is_relative_to(Path(repo).resolve()):
            sys.exit(1)
        continue
    name, _, version = want.partition("==")
    have = metadata.version(name)  # raises PackageNotFoundError when missing
    if name == "torch":
        have = have.split("+")[0]
    if version and have != version:
        sys.exit(1)
PY
}

# make_venv [X.Y WHY]: create $VENV from $PYTHON unless it is there; given X.Y, refuse a $PYTHON
# of another version, saying WHY that one is needed.
make_venv() {
    [[ -x "$VENV/bin/python" ]] && return 0
    if [[ $# -gt 0 ]]; then
        "$PYTHON" -c 'import sys; sys.exit(0 if "%d.%d" % sys.version_info[:2] == sys.argv[1] else 1)' "$1" || {
            log "$PYTHON is not Python $1 ($2)"
            exit 1
        }
    fi
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
}

# set_up_venv LISTED: the setup scripts' course, once they define venv_ready (whether $VENV holds
# what it must) and install_venv (make_venv, then the installs): nothing to do when venv_ready
# holds; else install_venv, after which venv_ready must hold, or the installed packages whose
# names match the extended regular expression LISTED are listed and the script exits 1.
set_up_venv() {
    SETUP_START=$(date +%s)
    if venv_ready; then
        log "already set up at $VENV"
        return
    fi
    install_venv
    venv_ready || {
        log "the venv at $VENV does not have the expected versions after install"
        "$VENV/bin/python" -m pip list 2>/dev/null | grep -iE "^($1) " >&2 || true
        exit 1
    }
}

# check_torch_cpu: fail unless $VENV's torch is a CPU build. peft depends on torch; if torch is not
# pinned on the same command line pip may pull a multi-GB CUDA build from PyPI.
check_torch_cpu() {
    "$VENV/bin/python" -c '
import sys, torch
if torch.version.cuda is not None:
    sys.exit(f"torch {torch.__version__} is a CUDA build ({torch.version.cuda}); expected CPU only")
print(f"torch {torch.__version__} (CPU)")
' >&2
}

# setup_done NAME...: print "name==version" for each of $VENV's packages NAME on one line, then how
# long the setup took since set_up_venv began (CI logs show the cost).
setup_done() {
    "$VENV/bin/python" - "$@" <<'PY' >&2
import sys
from importlib import metadata

print(" ".join(f"{n}=={metadata.version(n)}" for n in sys.argv[1:]))
PY
    log "install took $(( $(date +%s) - SETUP_START )) s"
}

# junit_counts XML: "PASSED FAILED SKIPPED" from a pytest JUnit report (FAILED counts errors too;
# "0 0 0" for a report that is missing or unreadable, as when pytest never started).
junit_counts() {
    "$VENV/bin/python" - "$1" <<'PY'
import sys
import xml.etree.ElementTree as ET

try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError):
    root = ET.Element("testsuites")
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
count = lambda key: sum(int(s.get(key, 0)) for s in suites)
bad = count("failures") + count("errors")
print(count("tests") - bad - count("skipped"), bad, count("skipped"))
PY
}
