"""Text a peer sends, masked for every configured credential before it is shown (docs/cli.md, "Credentials").

A peer's stderr, its in-band failure messages and what a crashed remote left are the far
side's words: a hostile or careless peer (a wb_path script that echoes its environment, an
exec command that prints it) can repeat a provider key of this machine's. Before such text
is printed, returned by `wb mcp` or shown on the page, every credential wb.yaml configures
is masked in it: each provider's `credential_env` value present in this environment and
each readable `credential_file`'s, however spelled (`courier.runs.privacy.redact_everywhere`).

The caller (`courier.call.caller.call_async`) applies it to every reply and every error of
a remote call, so the CLI, the MCP server and the page all get masked text; `redact_peer_text`
is for anything else that shows a peer's words.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import replace

from courier.channels.channel import Outcome
from courier.config import Config, Provider
from courier.errors import WbError
from courier.runs.privacy import redact_everywhere
from protocol import limits
from protocol.models import RemoteResponse, Result


def configured_secrets(config: Config, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Every credential wb.yaml's providers name that this process can read (each at least 8 bytes).

    A shorter value is no credential a run could use (docs/cli.md, "Credentials"), and masking
    it would rewrite ordinary text.
    """
    environ = os.environ if environ is None else environ
    found: set[str] = set()
    for provider in config.providers.values():
        if not isinstance(provider, Provider):
            continue
        if provider.credential_env:
            value = environ.get(provider.credential_env, "").strip()
        else:
            value = _read_quietly(provider.credential_file or "")
        if len(value.encode()) >= limits.CREDENTIAL_MIN_BYTES:
            found.add(value)
    return tuple(sorted(found, key=len, reverse=True))


def _read_quietly(path: str) -> str:
    """A credential file's text, or "" when it cannot be read (a run would say why; masking need not)."""
    if not path:
        return ""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # non-blocking: a FIFO never holds us
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return os.read(fd, limits.CREDENTIAL_FILE_MAX_BYTES).decode().strip()
        finally:
            os.close(fd)
    return ""


def redact_peer_text(text: str, secrets: Sequence[str]) -> str:
    """`text` with every one of `secrets` masked (see `configured_secrets`)."""
    return redact_everywhere(text, secrets) if secrets and text else text


def masked_outcome(outcome: Outcome, secrets: Sequence[str]) -> Outcome:
    """The outcome with its stderr masked whole, before any excerpt of it is cut (a cut would split a key)."""
    if not secrets or not outcome.stderr:
        return outcome
    text = outcome.stderr.decode("utf-8", "replace")
    masked = redact_everywhere(text, secrets)
    return outcome if masked == text else replace(outcome, stderr=masked.encode())


def mask_error(exc: WbError, secrets: Sequence[str]) -> None:
    """Mask the error's message in place (its class, exit code and cause stay)."""
    if secrets:
        exc.message = redact_everywhere(exc.message, secrets)
        exc.args = (exc.message, *exc.args[1:])


def mask_response(response: RemoteResponse, secrets: Sequence[str]) -> RemoteResponse:
    """The peer's own words in a reply: its failure, its list warnings, each run's failure and harness diagnostics."""
    if not secrets:
        return response
    if response.failure:
        response.failure = redact_everywhere(response.failure, secrets)
    for warning in response.warnings or []:  # a list reply's records it could not read, in its words
        warning.error = redact_everywhere(warning.error, secrets)
    results: list[Result] = []
    with contextlib.suppress(Exception):  # a reply kind without results (stop, diff, prune, version)
        results = response.results_of()
    with contextlib.suppress(Exception):
        results.append(response.result_of())
    for result in results:
        if result.failure:
            result.failure = redact_everywhere(result.failure, secrets)
        if result.harness_diagnostics:
            result.harness_diagnostics = [redact_everywhere(line, secrets) for line in result.harness_diagnostics]
    return response
