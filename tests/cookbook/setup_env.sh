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
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${COOKBOOK_VENV:-$REPO/.cookbook-venv}"
PYTHON="${COOKBOOK_PYTHON:-python3}"

COOKBOOK_VERSION="0.6.1"
TINKER_VERSION="0.38.0"
TORCH_VERSION="2.13.0"
TRIO_ASYNCIO_VERSION="0.16.0"

# log and quiet_pip
. "$REPO/tests/venv_tools.sh"

venv_ready() {
    [[ -x "$VENV/bin/python" ]] || return 1
    "$VENV/bin/python" - "$REPO" "$COOKBOOK_VERSION" "$TINKER_VERSION" "$TORCH_VERSION" "$TRIO_ASYNCIO_VERSION" <<'PY' 2>/dev/null
import sys
from importlib import metadata
from pathlib import Path

repo, cookbook_v, tinker_v, torch_v, trio_asyncio_v = sys.argv[1:]
for name, version in {"tinker-cookbook": cookbook_v, "tinker": tinker_v, "trio-asyncio": trio_asyncio_v}.items():
    if metadata.version(name) != version:
        sys.exit(1)
if metadata.version("torch").split("+")[0] != torch_v:
    sys.exit(1)
for name in ("math-verify", "pylatexenc", "transformers", "tokenizers", "peft", "pytest", "pytest-trio", "mypy"):
    metadata.version(name)
import trio_rl
if not Path(trio_rl.__file__).resolve().is_relative_to(Path(repo).resolve()):
    sys.exit(1)
PY
}

start=$(date +%s)
if venv_ready; then
    log "already set up at $VENV"
else
    [[ -x "$VENV/bin/python" ]] || { log "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
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
    venv_ready || {
        log "the venv at $VENV does not have the expected versions after install"
        "$VENV/bin/python" -m pip list 2>/dev/null | grep -iE '^(tinker|tinker-cookbook|torch|trio|trio-asyncio) ' >&2 || true
        exit 1
    }
fi
"$VENV/bin/python" -c '
from importlib import metadata
print(" ".join(f"{n}=={metadata.version(n)}" for n in ("tinker-cookbook", "tinker", "trio", "trio-asyncio", "transformers", "torch", "mypy")))
' >&2
log "install took $(( $(date +%s) - start )) s"
