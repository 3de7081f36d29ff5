#!/usr/bin/env bash
# Install the pinned Gemini CLI the e2e tests run (tests/e2e/test_real_gemini.py).
# Idempotent and fast when the pinned version is already on PATH; fails loudly otherwise.
set -euo pipefail

GEMINI_VERSION="0.61.0"
PACKAGE="@google/gemini-cli@${GEMINI_VERSION}"

installed_version() {
  # Prints the version `gemini --version` reports ("0.61.0"), or nothing. The CLI reads its
  # settings on start-up, so give it an empty private home rather than the caller's.
  local out home
  home="$(mktemp -d)"
  out="$(HOME="$home" GEMINI_CLI_HOME="$home" gemini --version </dev/null 2>/dev/null || true)"
  rm -rf "$home"
  out="$(printf '%s\n' "$out" | tail -n 1)"
  printf '%s\n' "${out##* }"
}

if command -v gemini >/dev/null 2>&1 && [ "$(installed_version)" = "$GEMINI_VERSION" ]; then
  echo "install-gemini: gemini ${GEMINI_VERSION} already installed at $(command -v gemini)"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "install-gemini: error: npm is not on PATH; cannot install ${PACKAGE} (the e2e tests need it)" >&2
  exit 1
fi

if ! npm install -g --no-fund --no-audit --loglevel=error "$PACKAGE" >/dev/null; then
  echo "install-gemini: error: npm install -g ${PACKAGE} failed" >&2
  exit 1
fi

# The global bin dir may not be on PATH in this shell; look there too.
prefix="$(npm prefix -g)"
export PATH="${prefix}/bin:${PATH}"
got="$(installed_version)"
if [ "$got" != "$GEMINI_VERSION" ]; then
  echo "install-gemini: error: after installing ${PACKAGE}, \`gemini --version\` reports '${got:-nothing}'" >&2
  exit 1
fi
echo "install-gemini: installed gemini ${GEMINI_VERSION} at $(command -v gemini)"
