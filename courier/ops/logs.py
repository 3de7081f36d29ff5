"""`logs`: the last worker actions, the raw transcript, or (follow) the actions as they happen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from courier.ops.op import Arg, McpTool, NotOnANode, Op, ToolCall, ref_arg, to_arg
from protocol import limits
from protocol.models import RemoteRequest, RemoteResponse
from protocol.operations import Operation
from protocol.refs import is_run_prefix
from protocol.rules import RequestRefused

# How long a follow call about a queued run waits before it answers: a follower polls, never in a busy loop.
QUEUED_FOLLOW_PAUSE_MS = 1 * limits.MS_PER_SECOND

if TYPE_CHECKING:
    from protocol.documents import ActionsDocument

_ACTION_INDENT = "  "


def _check(request: RemoteRequest) -> None:
    if request.tail < 0:
        raise RequestRefused(f"tail must be >= 0 (0 means the default of {limits.LOGS_TAIL_DEFAULT})")
    if not 0 <= request.follow_from <= limits.BYTE_OFFSET_MAX:
        raise RequestRefused("follow_from must be a byte offset of events.jsonl, 0 <= n < 2^63")
    if request.wait_timeout_ms < 0:
        raise RequestRefused("wait_timeout_ms must be >= 0")
    if request.follow and request.wait_timeout_ms > limits.FOLLOW_WAIT_MAX_MS:
        raise RequestRefused(
            f"a follow call waits at most {limits.FOLLOW_WAIT_MAX_MS} ms ({limits.FOLLOW_WAIT_MAX_TEXT}); "
            "repeat the call from next_offset"
        )


def check_tail(tail: int) -> None:
    from courier.errors import UsageError

    if tail < 1:
        raise UsageError("--tail must be at least 1")


def logs_request(reference: str, to: str | None, *, tail: int, raw: bool) -> tuple[str, RemoteRequest]:
    """(machine, the logs request), or the CLI's usage error."""
    from courier.commands import target

    check_tail(tail)
    machine, run_id = target(reference, to)
    return machine, RemoteRequest.of("logs", agent_id=run_id, tail=tail, raw=raw)


def with_whole_id(request: RemoteRequest, ask: Callable[[RemoteRequest], RemoteResponse]) -> RemoteRequest:
    """A short reference resolved first by one status call: a logs reply names no run, and its output must.

    Only for a prefix (docs/cli.md#short-references); a whole ID costs nothing.
    """
    if not is_run_prefix(request.agent_id):
        return request
    named = ask(RemoteRequest.of("status", agent_id=request.agent_id)).result_of().agent_id
    return request.model_copy(update={"agent_id": named})


def logs_text(logs: str, *, raw: bool, terminal: bool) -> str:
    """The reply's text as printed: the actions sanitised; the raw transcript as written (escaped on a terminal)."""
    from courier.text import escape_controls, sanitize

    if raw:
        return escape_controls(logs) if terminal else logs
    return sanitize(logs, keep_newlines=True)


def _lines(logs: str) -> list[str]:
    return logs.removesuffix("\n").split("\n") if logs else []  # not splitlines: U+2028 is no line break here


def actions_of(chunk: str) -> list[str]:
    """The actions of one `logs --follow` reply (indented lines, no transcript line), as `actions_document` lists
    them."""
    return [line.removeprefix(_ACTION_INDENT) for line in _lines(chunk)]


def actions_document(machine: str, agent_id: str, logs: str) -> ActionsDocument:
    """`logs --json` (docs/supervisors.md#the-documents): the logs reply's text (the transcript's path, then one
    indented action a line) as a document, so text and JSON never disagree."""
    from courier.runs.service import NO_TRANSCRIPT  # what the first line says when there is no transcript
    from protocol.documents import ActionsDocument

    lines = _lines(logs)
    head = lines[0] if lines else NO_TRANSCRIPT
    actions = [line.removeprefix(_ACTION_INDENT) for line in lines[1:]]
    return ActionsDocument(
        agent_id=agent_id,
        machine=machine or None,
        actions=actions,
        path=None if head == NO_TRANSCRIPT else head,
    )


def reply_text(request: RemoteRequest, response: RemoteResponse) -> str:
    """The reply's logs; this machine's raw transcript (handed over in-process) read into a bounded copy."""
    transcript = response.take_transcript()
    if transcript is None:
        return response.logs
    from courier.runs.service import raw_text

    return raw_text(request.agent_id, transcript)  # bounded as a reply's copy is


async def logs_tool(call: ToolCall, args: Any) -> dict[str, Any]:
    from protocol.documents import LogsDocument

    machine, request = logs_request(args.ref, args.to, tail=args.tail, raw=args.raw)
    client = await call.client()
    request = await call.blocking(lambda: with_whole_id(request, lambda asked: client.ask(machine, asked)))
    logs = await call.blocking(lambda: reply_text(request, client.ask(machine, request)))
    return LogsDocument(agent_id=request.agent_id, machine=machine or None, logs=logs).to_json()



def logs_before_start(request: RemoteRequest, response: RemoteResponse, run: NotOnANode) -> bool:
    """A run no node holds has no transcript yet: say why; a follower gets its Result after a pause."""
    from courier.errors import Finding

    if run.phase == "lost":
        raise Finding(f"agent run {request.agent_id}: node {run.node} lost; its records are on that node")
    if run.phase == "ended":
        response.logs = f"(it never started: {run.result.failure})\n"
    else:
        response.logs = "" if request.follow else f"(queued: waiting for {run.result.queued_for})\n"
    if request.follow:
        pause_ms = min(request.wait_timeout_ms or QUEUED_FOLLOW_PAUSE_MS, QUEUED_FOLLOW_PAUSE_MS)
        time.sleep(pause_ms / limits.MS_PER_SECOND)
        response.next_offset = request.follow_from
        response.result = run.result.to_wire()
    return True


OP = Op(
    wire=Operation(
        "logs",
        "logs",
        ("agent_id", "raw", "tail", "follow", "follow_from", "wait_timeout_ms"),
        needs_agent_id=True,
        check=_check,
    ),
    handler="courier.runs.service:logs_op",
    cluster="forward",
    before_start=logs_before_start,
    printed="actions",
    mcp=McpTool(
        "The transcript path, then the last worker actions (tail), or with raw the whole transcript.",
        "logs",
        arguments=(
            ref_arg(),
            to_arg(),
            Arg("tail", int, "How many worker actions (at least 1).", limits.LOGS_TAIL_DEFAULT),
            Arg("raw", bool, "The whole transcript (JSON lines) instead of the actions.", False),
        ),
        handler=logs_tool,
    ),
)
