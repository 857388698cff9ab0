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
# REPO, log, quiet_pip, lint_requirement, venv_has, make_venv, set_up_venv, check_torch_cpu, setup_done
. "$HERE/../venv_tools.sh"
VENV="${SKYRL_VENV:-$REPO/.skyvenv}"
PYTHON="${SKYRL_PYTHON:-python3.11}"
CONSTRAINTS="$HERE/constraints.txt"

SKYRL_VERSION="0.3.0"
TINKER_VERSION="0.24.1"
TORCH_VERSION="2.13.0"

# Exit 0 when the venv has everything at the expected versions, and trio_rl from this checkout.
venv_ready() {
    venv_has "skyrl==$SKYRL_VERSION" "tinker==$TINKER_VERSION" "torch==$TORCH_VERSION" \
        trio outcome safetensors pytest pytest-trio hypothesis mypy trio_rl-from-this-checkout
}

install_venv() {
    make_venv 3.11 "skyrl 0.3.0 + the CPU torch wheel need 3.11"

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
}

set_up_venv 'skyrl|tinker|torch|trio'
check_torch_cpu
setup_done skyrl tinker jax trio pytest mypy
