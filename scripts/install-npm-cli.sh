#!/usr/bin/env bash
# Install one pinned agent CLI from npm for the e2e tests: install-npm-cli.sh COMMAND PACKAGE VERSION.
# Idempotent and fast when COMMAND already reports VERSION; fails loudly otherwise.
set -euo pipefail

if [ $# -ne 3 ]; then
  echo "usage: $0 COMMAND PACKAGE VERSION (e.g. codex @openai/codex 0.169.0)" >&2
  exit 2
fi
command_name=$1
package="$2@$3"
version=$3
me="install-${command_name}"

reports_version() {
  # True when `COMMAND --version` names VERSION as a word ("codex-cli 0.169.0",
  # "2.1.328 (Claude Code)", "0.61.0"). Some CLIs write settings on start-up, so the probe
  # gets an empty private home rather than the caller's.
  local home out
  home="$(mktemp -d)"
  out="$(HOME="$home" CODEX_HOME="$home" CLAUDE_CONFIG_DIR="$home" GEMINI_CLI_HOME="$home" \
           "$command_name" --version </dev/null 2>/dev/null || true)"
  rm -rf "$home"
  printf '%s\n' "$out" | tr -s ' ()' '\n' | grep -qxF "$version"
}

node_major() { node --version 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/'; }

ensure_node() {
  # The pinned CLIs need node >= 20 (Gemini CLI 0.61 declares it; Claude Code's native binary
  # runs on it). Debian 12's own nodejs is 18: then a current node comes from the npm registry.
  if ! command -v npm >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    echo "${me}: installing nodejs and npm with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "${me}: error: npm is not on PATH; cannot install ${package} (the e2e tests need it)" >&2
    exit 1
  fi
  local major
  major="$(node_major)"
  if [ -z "$major" ] || [ "$major" -lt 20 ]; then
    echo "${me}: node ${major:-missing} is older than 20; installing node 22 from the npm registry"
    npm install -g --no-fund --no-audit --loglevel=error node@22 >/dev/null
    hash -r
    export PATH="$(npm prefix -g)/bin:${PATH}"
  fi
}

if command -v "$command_name" >/dev/null 2>&1 && reports_version; then
  echo "${me}: ${command_name} ${version} already installed at $(command -v "$command_name")"
  exit 0
fi
ensure_node
if ! npm install -g --no-fund --no-audit --loglevel=error "$package" >/dev/null; then
  echo "${me}: error: npm install -g ${package} failed" >&2
  exit 1
fi
# The global bin dir may not be on PATH in this shell; look there too.
export PATH="$(npm prefix -g)/bin:${PATH}"
if ! reports_version; then
  echo "${me}: error: after installing ${package}, \`${command_name} --version\` does not report ${version}" >&2
  exit 1
fi
echo "${me}: installed ${command_name} ${version} at $(command -v "$command_name")"
