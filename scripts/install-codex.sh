#!/usr/bin/env bash
# Install the pinned Codex CLI the e2e tests run (tests/e2e/test_real_codex.py).
# Idempotent and fast when the pinned version is already on PATH; fails loudly otherwise.
set -euo pipefail

CODEX_VERSION="0.169.0"
PACKAGE="@openai/codex@${CODEX_VERSION}"

installed_version() {
  # Prints the version `codex --version` reports ("codex-cli 0.169.0" -> "0.169.0"), or nothing.
  local out
  out="$(codex --version 2>/dev/null || true)"
  printf '%s\n' "${out##* }"
}

if command -v codex >/dev/null 2>&1 && [ "$(installed_version)" = "$CODEX_VERSION" ]; then
  echo "install-codex: codex ${CODEX_VERSION} already installed at $(command -v codex)"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "install-codex: error: npm is not on PATH; cannot install ${PACKAGE} (the e2e tests need it)" >&2
  exit 1
fi

if ! npm install -g --no-fund --no-audit --loglevel=error "$PACKAGE" >/dev/null; then
  echo "install-codex: error: npm install -g ${PACKAGE} failed" >&2
  exit 1
fi

# The global bin dir may not be on PATH in this shell; look there too.
prefix="$(npm prefix -g)"
export PATH="${prefix}/bin:${PATH}"
got="$(installed_version)"
if [ "$got" != "$CODEX_VERSION" ]; then
  echo "install-codex: error: after installing ${PACKAGE}, \`codex --version\` reports '${got:-nothing}'" >&2
  exit 1
fi
echo "install-codex: installed codex ${CODEX_VERSION} at $(command -v codex)"
