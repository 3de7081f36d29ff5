#!/usr/bin/env bash
# One command on a fresh machine: install wb (and git when missing), then run `wb demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v git >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git >/dev/null
fi
python3 -m pip install -q --disable-pip-version-check -e .
exec python3 -m courier.main demo
