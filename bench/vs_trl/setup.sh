#!/usr/bin/env bash
# TRL in its own venv, beside the project's: bench/vs_trl/.venv (git-ignored).
# It reuses the project venv's torch, transformers and peft through a .pth file,
# so both sides run the very same torch build; only TRL and its own dependencies
# are installed here. Remove it afterwards with: rm -rf bench/vs_trl/.venv
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-$here/../../.venv/bin/python}"
trl_version="${TRL_VERSION:-1.16.0}"
"$python" -m venv "$here/.venv"
site="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
own="$("$here/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$site" > "$own/project_venv.pth"
"$here/.venv/bin/pip" install -q "trl==$trl_version"
"$here/.venv/bin/python" -c 'import trl, torch; print("trl", trl.__version__, "torch", torch.__version__)'
