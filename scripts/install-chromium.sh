#!/usr/bin/env bash
# Install Debian's headless-capable Chromium and its WebDriver for the browser tier (tests/browser/, docs/ui.md).
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-chromium: chromium and chromium-driver are missing; run as root (apt-get) or install them" >&2
  exit 1
fi
echo "installing: chromium chromium-driver"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
