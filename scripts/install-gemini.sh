#!/usr/bin/env bash
# Install the pinned gemini CLI the e2e tests run (tests/e2e/test_real_gemini.py).
exec bash "$(dirname "$0")/install-npm-cli.sh" gemini @google/gemini-cli 0.61.0
