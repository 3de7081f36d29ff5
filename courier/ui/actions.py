"""Stop and continue from the page (docs/ui.md, "Actions"): HTML form POSTs, answered with a page.

A refusal shows the message the CLI would print (`error: …`, its WbError's text), with the
HTTP status a form can show: 400 for a usage error, 409 for any other refusal, 502 when the
machine could not be reached.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from courier.errors import TransportError, UsageError, WbError
from protocol import limits

# A follow-up task is at most TASK_MAX_BYTES (docs/cli.md#wb-agent-dispatch); form-encoding can
# double it, so the form may be twice that.
FORM_MAX_BYTES = 2 * limits.TASK_MAX_BYTES
FORM_MAX_TEXT = f"{FORM_MAX_BYTES // limits.MIB} MiB"


# The review form sends one field per commented diff line (docs/ui.md, comments on the diff), besides its task.
COMMENTS_MAX = 200
FORM_MAX_FIELDS = COMMENTS_MAX + 2
COMMENT_PREFIX = "c "  # a comment's field is named `c PATH:LINE` (ui.js), so the task can say where it is


class FormTooLarge(Exception):
    pass


class FormMalformed(Exception):
    """A form body the page would never send (too many fields); its text is the one-line answer."""


def parse_form(body: bytes) -> dict[str, str]:
    """An application/x-www-form-urlencoded body (the only kind the page's forms send)."""
    if len(body) > FORM_MAX_BYTES:
        raise FormTooLarge
    try:
        fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=FORM_MAX_FIELDS)
    except ValueError:  # "Max number of fields exceeded"
        raise FormMalformed(
            f"the form has more than {FORM_MAX_FIELDS} fields; a review sends at most {COMMENTS_MAX} comments"
        ) from None
    return {key: values[0] for key, values in fields.items()}


def refusal_status(error: WbError) -> int:
    if isinstance(error, UsageError):
        return 400
    if isinstance(error, TransportError):
        return 502
    return 409


def cli_message(error: WbError) -> str:
    return f"error: {error.message}"


def browser_task(text: str) -> str:
    """A textarea sends CRLF line ends; the task is the text as typed."""
    return text.replace("\r\n", "\n")


def review_task(form: dict[str, str]) -> str:
    """`continue with comments`: one `PATH:LINE: comment` line per commented diff line, in the order the page
    sent them (file order, then line order), then the free text; blank comments are left out."""
    lines = [
        f"{name[len(COMMENT_PREFIX) :]}: {browser_task(text).strip()}"
        for name, text in form.items()
        if name.startswith(COMMENT_PREFIX) and text.strip()
    ]
    rest = browser_task(form.get("task", "")).strip()
    return "\n".join(lines) + ("\n\n" + rest if lines and rest else rest)
