#!/usr/bin/env bash
# Install the pinned claude CLI the e2e tests run (tests/e2e/test_real_claude.py).
exec bash "$(dirname "$0")/install-npm-cli.sh" claude @anthropic-ai/claude-code 2.1.328
