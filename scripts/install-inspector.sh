#!/usr/bin/env bash
# Install the pinned MCP Inspector whose CLI mode tests `wb mcp` (tests/integration/test_mcp_inspector.py).
# Idempotent and fast when the pinned version is already on PATH; fails loudly otherwise.
set -euo pipefail

INSPECTOR_VERSION="2.12.0"
PACKAGE="@modelcontextprotocol/inspector@${INSPECTOR_VERSION}"

installed_version() {
  mcp-inspector --version 2>/dev/null || true
}

if command -v mcp-inspector >/dev/null 2>&1 && [ "$(installed_version)" = "$INSPECTOR_VERSION" ]; then
  echo "install-inspector: mcp-inspector ${INSPECTOR_VERSION} already installed at $(command -v mcp-inspector)"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "install-inspector: error: npm is not on PATH; cannot install ${PACKAGE} (the MCP tests need it)" >&2
  exit 1
fi

if ! npm install -g --no-fund --no-audit --loglevel=error "$PACKAGE" >/dev/null; then
  echo "install-inspector: error: npm install -g ${PACKAGE} failed" >&2
  exit 1
fi

prefix="$(npm prefix -g)"
export PATH="${prefix}/bin:${PATH}"
got="$(installed_version)"
if [ "$got" != "$INSPECTOR_VERSION" ]; then
  echo "install-inspector: error: after installing ${PACKAGE}, \`mcp-inspector --version\` reports '${got:-nothing}'" >&2
  exit 1
fi
echo "install-inspector: installed mcp-inspector ${INSPECTOR_VERSION} at $(command -v mcp-inspector)"
