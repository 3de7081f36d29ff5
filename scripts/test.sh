#!/usr/bin/env bash
# The test command the README names: the whole suite, real git, real processes, real sshd.
# Uses the repository's .venv (made by .ci/run or scripts/demo.sh) when there is one.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
exec "$PY" -m pytest -p no:cacheprovider "$@"
