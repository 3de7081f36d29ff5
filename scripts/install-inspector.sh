#!/usr/bin/env bash
# Install the pinned MCP Inspector whose CLI mode tests `wb mcp` (tests/integration/test_mcp_inspector.py).
exec bash "$(dirname "$0")/install-npm-cli.sh" mcp-inspector @modelcontextprotocol/inspector 2.12.0
