#!/usr/bin/env bash
# Create (or verify) the virtual environment for the tinker-cookbook suite.
#
# It holds tinker-cookbook 0.6.1 next to trio_rl (editable, from this checkout), and
# peft, which HFBackend needs to train the recipes of test_cookbook_drop_in.py, and the
# mypy of pyproject's lint extra, which run.sh checks tests/cookbook with against these packages.
# The cookbook declares tml-renderers>=0.4.1, which the package index here does
# not have; its RL code never imports it, so the cookbook goes in with --no-deps
# and its other runtime requirements are named one by one below.
#
# Environment:
#   COOKBOOK_VENV   where to create it (default: <repo>/.cookbook-venv; keep it out of git)
#   COOKBOOK_PYTHON the interpreter to build it from (default: python3)
#
# Idempotent: a venv that already has the right versions (and trio_rl from THIS
# checkout) is only verified. Prints "setup_env: install took N s".
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# REPO, log, quiet_pip, lint_requirement, venv_has, make_venv, set_up_venv, setup_done
. "$HERE/../venv_tools.sh"
VENV="${COOKBOOK_VENV:-$REPO/.cookbook-venv}"
PYTHON="${COOKBOOK_PYTHON:-python3}"

COOKBOOK_VERSION="0.6.1"
TINKER_VERSION="0.38.0"
TORCH_VERSION="2.13.0"
TRIO_ASYNCIO_VERSION="0.16.0"

venv_ready() {
    venv_has "tinker-cookbook==$COOKBOOK_VERSION" "tinker==$TINKER_VERSION" "trio-asyncio==$TRIO_ASYNCIO_VERSION" \
        "torch==$TORCH_VERSION" math-verify pylatexenc transformers tokenizers peft pytest pytest-trio mypy \
        trio_rl-from-this-checkout
}

install_venv() {
    make_venv
    # torch first and alone: it is the CPU build from local disk, and pinning it
    # keeps any later resolver from reaching for a multi-GB CUDA build.
    log "installing torch==$TORCH_VERSION (CPU)"
    quiet_pip install --quiet "torch==$TORCH_VERSION"
    log "installing tinker-cookbook==$COOKBOOK_VERSION (--no-deps) and its runtime requirements"
    quiet_pip install --quiet --no-deps "tinker-cookbook==$COOKBOOK_VERSION"
    quiet_pip install --quiet "torch==$TORCH_VERSION" "tinker==$TINKER_VERSION" \
        aiohttp anyio blobfile chz cloudpickle datasets huggingface-hub numpy pillow pydantic pyrage \
        rich safetensors termcolor tiktoken tqdm 'transformers>=4.57.6,!=5.3.0,!=5.4.*,!=5.5.*,!=5.6.*' \
        math-verify pylatexenc 'peft>=0.17'
    log "installing trio_rl (editable) with trio-asyncio, the test runner and the type checker"
    quiet_pip install --quiet "torch==$TORCH_VERSION" "tinker==$TINKER_VERSION" \
        "trio-asyncio==$TRIO_ASYNCIO_VERSION" "$(lint_requirement mypy)" -e "$REPO[test]"
}

set_up_venv 'tinker|tinker-cookbook|torch|trio|trio-asyncio'
setup_done tinker-cookbook tinker trio trio-asyncio transformers torch mypy
