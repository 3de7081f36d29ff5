"""Coding-agent harness adapters (contract §7.3): argv, event parsing, summaries."""
