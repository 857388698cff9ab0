#!/usr/bin/env bash
# Create (or verify) the virtual environment for the integration tests.
#
# One venv holds both sides:
#   * the server: skyrl[tinker,jax]==0.3.0 (SkyRL's Tinker-API server, JAX on CPU);
#   * the client: trio_rl itself (editable, from this checkout) running on
#     tinker==0.24.1, the newest SDK that still speaks JSON to skyrl 0.3.0;
#   * the mypy of pyproject's lint extra, which run.sh checks tests/integration with.
#
# Environment:
#   SKYRL_VENV       where to create it (default: <repo>/.skyvenv; keep it out of git)
#   SKYRL_PYTHON     the Python 3.11 interpreter to build it from (default: python3.11)
#   SKYRL_UNPINNED=1 resolve without tests/integration/constraints.txt (to refresh the pins)
#
# Idempotent: if the venv already has the right versions it only prints them.
# Prints "setup_env: install took N s" so CI logs show the cost.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${SKYRL_VENV:-$REPO/.skyvenv}"
PYTHON="${SKYRL_PYTHON:-python3.11}"
CONSTRAINTS="$HERE/constraints.txt"

SKYRL_VERSION="0.3.0"
TINKER_VERSION="0.24.1"
TORCH_VERSION="2.13.0"

# log and quiet_pip
. "$REPO/tests/venv_tools.sh"

# Exit 0 when the venv has everything at the expected versions, and trio_rl is
# imported from THIS checkout (CI clones the repo into a fresh folder, so an
# editable install left by an earlier checkout must not count).
venv_ready() {
    [[ -x "$VENV/bin/python" ]] || return 1
    "$VENV/bin/python" - "$REPO" "$SKYRL_VERSION" "$TINKER_VERSION" "$TORCH_VERSION" <<'PY' 2>/dev/null
import sys
from importlib import metadata
from pathlib import Path

repo, skyrl_v, tinker_v, torch_v = sys.argv[1:]
want = {"skyrl": skyrl_v, "tinker": tinker_v}
for name, version in want.items():
    if metadata.version(name) != version:
        sys.exit(1)
if metadata.version("torch").split("+")[0] != torch_v:
    sys.exit(1)
for name in ("trio", "outcome", "safetensors", "pytest", "pytest-trio", "hypothesis", "mypy"):
    metadata.version(name)  # raises PackageNotFoundError when missing
import trio_rl
if not Path(trio_rl.__file__).resolve().is_relative_to(Path(repo).resolve()):
    sys.exit(1)
PY
}

check_torch_cpu() {
    # peft depends on torch; if torch is not pinned on the same command line pip
    # may pull a multi-GB CUDA build from PyPI. Refuse to go on with one.
    "$VENV/bin/python" -c '
import sys, torch
if torch.version.cuda is not None:
    sys.exit(f"torch {torch.__version__} is a CUDA build ({torch.version.cuda}); expected CPU only")
print(f"torch {torch.__version__} (CPU)")
' >&2
}

start=$(date +%s)

if venv_ready; then
    log "already set up at $VENV"
else
    if [[ ! -x "$VENV/bin/python" ]]; then
        "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' || {
            log "$PYTHON is not Python 3.11 (skyrl 0.3.0 + the CPU torch wheel need 3.11)"
            exit 1
        }
        log "creating $VENV"
        "$PYTHON" -m venv "$VENV"
    fi

    constraint_args=(-c "$CONSTRAINTS")
    if [[ "${SKYRL_UNPINNED:-0}" == "1" ]]; then
        log "SKYRL_UNPINNED=1: resolving without $CONSTRAINTS"
        constraint_args=()
    fi

    # torch, skyrl and tinker on ONE command line so the resolver can never pick
    # a CUDA torch for peft.
    log "installing skyrl[tinker,jax]==$SKYRL_VERSION torch==$TORCH_VERSION tinker==$TINKER_VERSION"
    quiet_pip install --quiet "${constraint_args[@]}" \
        "skyrl[tinker,jax]==$SKYRL_VERSION" "torch==$TORCH_VERSION" "tinker==$TINKER_VERSION"

    # The client side: trio_rl from this checkout, without letting its own
    # (wider) dependency ranges move tinker or torch.
    log "installing trio_rl (editable), the test runner and the type checker"
    quiet_pip install --quiet "${constraint_args[@]}" \
        trio outcome safetensors pytest pytest-trio hypothesis "$(lint_requirement mypy)"
    quiet_pip install --quiet --no-deps -e "$REPO"

    venv_ready || {
        log "the venv at $VENV does not have the expected versions after install"
        "$VENV/bin/python" -m pip list 2>/dev/null | grep -iE '^(skyrl|tinker|torch|trio) ' >&2 || true
        exit 1
    }
fi

check_torch_cpu
"$VENV/bin/python" -c '
from importlib import metadata
print(" ".join(f"{n}=={metadata.version(n)}" for n in ("skyrl", "tinker", "jax", "trio", "pytest", "mypy")))
' >&2
log "install took $(( $(date +%s) - start )) s"
