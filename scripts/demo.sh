#!/usr/bin/env bash
# One command on a fresh machine: install wb into .venv (and git when missing), then run `wb demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v git >/dev/null 2>&1; then
  echo "installing: git (apt-get install git)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git >/dev/null
fi
# shellcheck source=scripts/venv.sh
. scripts/venv.sh
wb_install_venv
echo "running the demo (wb demo)"
exec "$PY" -m courier.main demo
