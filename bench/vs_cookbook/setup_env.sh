#!/usr/bin/env bash
# Build (or verify) the virtual environment the cookbook side of the benchmark runs in:
# tinker-cookbook 0.6.1 and the runtime requirements of its RL loop, every one pinned.
#
# tinker-cookbook 0.6.1 declares tml-renderers>=0.4.1, which the package index here
# does not carry; its RL loop never imports it, so the cookbook is installed with
# --no-deps and what it needs at run time is named below. trio_rl is NOT installed
# here: the two sides of the benchmark share no code.
#
# Environment:
#   VS_COOKBOOK_VENV   where to build it (default: <repo>/.vs-cookbook-venv, git-ignored)
#   VS_COOKBOOK_PYTHON the interpreter to build it from (default: python3)
#
# Idempotent: a venv that already holds exactly these versions is only checked.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${VS_COOKBOOK_VENV:-$REPO/.vs-cookbook-venv}"
PYTHON="${VS_COOKBOOK_PYTHON:-python3}"

# name==version, as measured working together on 2026-12-01.
TORCH="torch==2.13.0"
COOKBOOK="tinker-cookbook==0.6.1"
REQUIREMENTS=(
    "tinker==0.38.0" "aiohttp==3.14.5" "anyio==4.16.0" "blobfile==3.3.0" "chz==0.4.0"
    "cloudpickle==3.1.3" "datasets==5.2.0" "huggingface-hub==2.4.0" "numpy==2.4.6"
    "pillow==13.0.0" "pydantic==2.14.4" "pyrage==1.4.0" "rich==15.0.0" "safetensors==0.8.0"
    "termcolor==3.3.0" "tiktoken==0.14.0" "tqdm==4.70.1" "transformers==5.24.0"
)

# log and quiet_pip
. "$REPO/tests/venv_tools.sh"

# Exit 0 when every pinned package is installed at its pinned version.
venv_matches() {
    [[ -x "$VENV/bin/python" ]] || return 1
    "$VENV/bin/python" - "$TORCH" "$COOKBOOK" "${REQUIREMENTS[@]}" <<'PY'
import sys
from importlib import metadata

wrong = []
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    try:
        have = metadata.version(name).split("+")[0]
    except metadata.PackageNotFoundError:
        have = None
    if have != version:
        wrong.append(f"{name} (want {version}, have {have})")
if wrong:
    print("setup_env: not as pinned: " + ", ".join(wrong), file=sys.stderr)
    sys.exit(1)
PY
}

start=$(date +%s)
if venv_matches 2>/dev/null; then
    log "already set up at $VENV"
else
    [[ -x "$VENV/bin/python" ]] || { log "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
    # torch alone first (the CPU build on local disk), then kept pinned so no later
    # resolution reaches for another build.
    log "installing $TORCH"
    quiet_pip install --quiet "$TORCH"
    log "installing $COOKBOOK (--no-deps)"
    quiet_pip install --quiet --no-deps "$COOKBOOK"
    log "installing the cookbook loop's runtime requirements"
    quiet_pip install --quiet "$TORCH" "${REQUIREMENTS[@]}"
    if ! venv_matches; then
        log "the venv at $VENV does not hold the pinned versions after installing"
        exit 1
    fi
fi
# The loop must import; fail here rather than in the middle of a benchmark.
"$VENV/bin/python" -c "import tinker_cookbook.rl.train" || {
    log "tinker_cookbook.rl.train does not import in $VENV"
    exit 1
}
log "ready in $(( $(date +%s) - start )) s: $VENV"
