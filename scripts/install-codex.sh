#!/usr/bin/env bash
# Install the pinned codex CLI the e2e tests run (tests/e2e/test_real_codex.py).
exec bash "$(dirname "$0")/install-npm-cli.sh" codex @openai/codex 0.169.0
