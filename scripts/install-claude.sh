#!/usr/bin/env bash
# Install the pinned Claude Code CLI the e2e tests run (tests/e2e/test_real_claude.py).
# Idempotent and fast when the pinned version is already on PATH; fails loudly otherwise.
set -euo pipefail

CLAUDE_VERSION="2.1.328"
PACKAGE="@anthropic-ai/claude-code@${CLAUDE_VERSION}"

installed_version() {
  # Prints the version `claude --version` reports ("2.1.328 (Claude Code)" -> "2.1.328"), or nothing.
  local out
  out="$(claude --version 2>/dev/null || true)"
  printf '%s\n' "${out%% *}"
}

if command -v claude >/dev/null 2>&1 && [ "$(installed_version)" = "$CLAUDE_VERSION" ]; then
  echo "install-claude: claude ${CLAUDE_VERSION} already installed at $(command -v claude)"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "install-claude: error: npm is not on PATH; cannot install ${PACKAGE} (the e2e tests need it)" >&2
  exit 1
fi

if ! npm install -g --no-fund --no-audit --loglevel=error "$PACKAGE" >/dev/null; then
  echo "install-claude: error: npm install -g ${PACKAGE} failed" >&2
  exit 1
fi

# The global bin dir may not be on PATH in this shell; look there too.
prefix="$(npm prefix -g)"
export PATH="${prefix}/bin:${PATH}"
got="$(installed_version)"
if [ "$got" != "$CLAUDE_VERSION" ]; then
  echo "install-claude: error: after installing ${PACKAGE}, \`claude --version\` reports '${got:-nothing}'" >&2
  exit 1
fi
echo "install-claude: installed claude ${CLAUDE_VERSION} at $(command -v claude)"
