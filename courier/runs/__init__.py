"""Runs on this machine: records, worktrees, the detached owner and the harness."""
