"""Run IDs, machine names, worktree and repository names, and agent references
(docs/protocol.md#names-and-references)."""

from __future__ import annotations

import re
import secrets

ID_PREFIX = "agt-"
_RUN_ID = re.compile(r"agt-[0-9a-f]{32}")
# A reference may name a run by a unique prefix of its ID (docs/cli.md#short-references).
PREFIX_MIN_DIGITS = 6
_RUN_REF = re.compile(rf"agt-[0-9a-f]{{{PREFIX_MIN_DIGITS},32}}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_OWNER = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,38}")
_REPO = re.compile(r"[A-Za-z0-9._-]{1,100}")


class BadName(ValueError):
    """A run ID, machine, worktree, repository or reference that docs/protocol.md#names-and-references refuses."""


def new_run_id() -> str:
    """Mint a fresh run ID from the operating system's CSPRNG."""
    return ID_PREFIX + secrets.token_hex(16)


def check_run_id(text: str) -> str:
    if not _RUN_ID.fullmatch(text):
        raise BadName(f'invalid agent run ID "{text}": expected "agt-" followed by exactly 32 lowercase hex characters')
    return text


def is_run_id(text: str) -> bool:
    return _RUN_ID.fullmatch(text) is not None


def check_run_ref(text: str) -> str:
    """A whole run ID or a prefix of one (at least 6 hex digits) that the run's machine resolves."""
    if not _RUN_REF.fullmatch(text):
        raise BadName(
            f'invalid agent run ID "{text}": expected "agt-" followed by its 32 lowercase hex characters, '
            f"or at least the first {PREFIX_MIN_DIGITS} of them"
        )
    return text


def is_run_prefix(text: str) -> bool:
    """A short reference: a prefix of a run ID, not a whole one."""
    return _RUN_REF.fullmatch(text) is not None and not is_run_id(text)


def check_machine_name(text: str) -> str:
    if not _NAME.fullmatch(text):
        raise BadName(
            f'invalid machine name "{text}": use 1-63 letters, digits, ".", "_" or "-", starting with a letter or digit'
        )
    return text


def check_worktree_name(text: str) -> str:
    if not _NAME.fullmatch(text) or ".." in text or text.endswith(".lock"):
        raise BadName(
            f'invalid worktree name "{text}": use 1-63 letters, digits, ".", "_" or "-", '
            'starting with a letter or digit, without ".." and not ending in ".lock"'
        )
    return text


def check_repository(text: str) -> str:
    owner, slash, repo = text.partition("/")
    valid = (
        slash == "/"
        and _OWNER.fullmatch(owner) is not None
        and _REPO.fullmatch(repo) is not None
        and repo not in (".", "..")
        and not repo.endswith(".git")
    )
    if not valid:
        raise BadName(
            f'invalid repository "{text}": expected OWNER/REPO (owner: letters, digits and "-"; '
            'repo: letters, digits, ".", "_" or "-", not ending in ".git")'
        )
    return text


def split_reference(reference: str) -> tuple[str, str]:
    """Split `machine:agt-…` or a bare run ID (or a prefix of one) into (machine, run ID); "" when local."""
    machine, colon, run_id = reference.partition(":")
    if not colon:
        return "", check_run_ref(reference.strip())
    machine, run_id = machine.strip(), run_id.strip()
    if not machine or not run_id:
        raise BadName(f'invalid agent reference "{reference}": expected a run ID or MACHINE:RUN-ID')
    return check_machine_name(machine), check_run_ref(run_id)


def format_reference(machine: str, run_id: str) -> str:
    return f"{machine}:{run_id}" if machine else run_id
