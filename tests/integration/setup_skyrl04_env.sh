#!/usr/bin/env bash
# Create (or verify) the venv of the skyrl 0.4.0 server that the cookbook suite trains against.
#
# Why a second server venv: tinker-cookbook 0.6.1 needs tinker SDK >= 0.26 (0.6.1's rl code uses
# tinker.PromptProvenanceSpan) and declares >= 0.38; skyrl 0.3.0, the integration suite's server,
# parses only the JSON that SDK 0.24.x sends. skyrl 0.4.0 parses the protobuf of later SDKs. The
# client side is the cookbook venv (tests/cookbook/setup_env.sh: tinker 0.38.0 + cookbook 0.6.1 +
# trio_rl); this venv holds the server alone and does not install trio_rl.
#
# skyrl 0.4.0 declares Requires-Python >= 3.12, but its code parses and runs on 3.11 (with the
# launcher's TypedDict fix, tests/integration/skyrl_server.py), and the CPU torch wheel here is
# for 3.11 only; so skyrl goes in with --no-deps --ignore-requires-python, and its runtime
# requirements are named below and pinned by constraints-skyrl04.txt (see its header for the two
# pins that differ from what skyrl declares).
#
# Environment:
#   SKYRL04_VENV     where to create it (default: <repo>/.skyvenv04; keep it out of git)
#   SKYRL_PYTHON     the Python 3.11 interpreter to build it from (default: python3.11)
#
# Idempotent. Prints "setup_env: install took N s".
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# REPO, log, quiet_pip, venv_has, make_venv, set_up_venv, check_torch_cpu, setup_done
. "$HERE/../venv_tools.sh"
VENV="${SKYRL04_VENV:-$REPO/.skyvenv04}"
PYTHON="${SKYRL_PYTHON:-python3.11}"
CONSTRAINTS="$HERE/constraints-skyrl04.txt"

SKYRL_VERSION="0.4.0"
SERVER_TINKER_VERSION="0.25.0"
TORCH_VERSION="2.13.0"

venv_ready() {
    venv_has "skyrl==$SKYRL_VERSION" "tinker==$SERVER_TINKER_VERSION" "torch==$TORCH_VERSION" \
        jax flax optax fastapi uvicorn sqlmodel aiosqlite aiohttp peft transformers
}

install_venv() {
    make_venv 3.11 "the CPU torch wheel here is for 3.11"
    # torch on the same command line as peft, so the resolver cannot reach for a CUDA build.
    log "installing skyrl $SKYRL_VERSION's runtime requirements (tinker==$SERVER_TINKER_VERSION, JAX on CPU)"
    quiet_pip install --quiet -c "$CONSTRAINTS" "torch==$TORCH_VERSION" "tinker==$SERVER_TINKER_VERSION" \
        'fastapi[standard]' sqlmodel 'sqlalchemy[asyncio]' aiosqlite asyncpg psycopg2-binary \
        jax flax optax datasets pillow rich safetensors tokenizers transformers typer peft hf_transfer \
        cloudpathlib zstandard xxhash psutil aiohttp
    log "installing skyrl==$SKYRL_VERSION (--no-deps --ignore-requires-python)"
    quiet_pip install --quiet --no-deps --ignore-requires-python "skyrl==$SKYRL_VERSION"
}

set_up_venv 'skyrl|tinker|torch|jax|flax'
check_torch_cpu
setup_done skyrl tinker jax flax torch
