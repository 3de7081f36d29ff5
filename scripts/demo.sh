#!/usr/bin/env bash
# One command on a fresh machine: install wb into .venv (and git when missing), then run `wb demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v git >/dev/null 2>&1; then
  echo "installing: git (apt-get install git)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git >/dev/null
fi
if ! command -v bwrap >/dev/null 2>&1; then
  # Runs are confined with bubblewrap where it is usable (docs/security.md#confined-runs).
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing: bubblewrap (apt-get install bubblewrap), which confines each run"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
  else
    echo "note: bubblewrap is not installed, so the demo's run is not confined (its status says so);" \
      "install it with your package manager (Debian/Ubuntu: bubblewrap)"
  fi
fi
# shellcheck source=scripts/venv.sh
. scripts/venv.sh
wb_install_venv
echo "running the demo (wb demo)"
exec "$PY" -m courier.main demo
