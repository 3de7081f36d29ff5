#!/usr/bin/env bash
# The test command the README names: the whole suite, real git, real processes, real sshd.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m pytest -p no:cacheprovider "$@"
