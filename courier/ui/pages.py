"""The HTML of every page and fragment (docs/ui.md), rendered on the server.

Everything that came from a run or a machine (results, worker actions, diffs, a peer's
errors, paths, names) goes through `esc`: sanitised like terminal output, then HTML-escaped,
so nothing from a run can inject markup or script. The Content-Security-Policy (auth.py)
allows only /static/ui.js besides, a second wall should an escape ever be missed.
"""

from __future__ import annotations

import html
from urllib.parse import quote, urlencode

from courier.client.fleet import MachineRow
from courier.ops.status import status_text
from courier.render import ref_of, state_text
from courier.runs.watch_op import FINISHED, RUNNING, phase_of
from courier.text import sanitize
from courier.ui.asks import FleetView
from courier.ui.diffview import FileDiff, Hunk, files_of
from protocol import limits
from protocol.durations import format_duration_ms
from protocol.models import DiffResult, Result
from protocol.timestamps import parse_rfc3339, utc_now

LOCAL = "@local"  # this machine in the machine filter (no machine name can start with "@")
_TAB = "    "


def esc(text: object) -> str:
    return html.escape(sanitize(str(text).replace("\t", _TAB), keep_newlines=True), quote=True)


def run_path(root: str, ref: str) -> str:
    """A run's page under the session root (courier/ui/auth.py: the root is the page's credential)."""
    return root + "/run/" + quote(ref, safe=":")


def node_of(result: Result) -> str | None:
    """The Ray node a run ran on, when its machine reports one (a newer Result field; absent before it)."""
    node = getattr(result, "node", None)
    return str(node) if node else None


def shown_state(result: Result) -> str:
    """The state as the CLI says it (`running (stalled 14m)`), with the phase when it says more (queued, waiting)."""
    text = state_text(result)
    phase = phase_of(result)
    if phase not in (FINISHED, RUNNING) and phase not in text:
        text += f" ({phase})"
    return text


# The kinds the fleet page counts and colours (docs/ui.md, the fleet page), in the order it shows them.
KINDS = ("running", "stalled", "queued", "waiting", "completed", "failed", "stopped", "timeout", "abandoned")
RUNS_PER_PAGE = 100


def kind_of(result: Result) -> str:
    """A run's kind on the page: its phase while it goes on, else its state, `stopped` for one stopped on request."""
    if not result.terminal:
        return phase_of(result)
    if result.state == "failed" and (result.failure or "").startswith("stopped on request"):
        return "stopped"
    return result.state


def page(root: str, title: str, body: str, *, page_kind: str, extra: str = "") -> str:
    return (
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title>"
        f'<link rel=stylesheet href="{esc(root)}/static/ui.css"><script src="{esc(root)}/static/ui.js" defer></script>'
        f'</head><body data-page="{page_kind}"{extra}>'
        f'<header><a class=brand href="{esc(root)}/">wb</a> <span>{esc(title)}</span></header>'
        f"<main>{body}</main></body></html>\n"
    )


# -- the fleet page --------------------------------------------------------------------------------


def matches(result: Result, state: str, machine: str) -> bool:
    if state and state not in (result.state, phase_of(result)):
        return False
    return not machine or (result.machine or LOCAL) == machine


def matches_kind(result: Result, state: str, machine: str) -> bool:
    """The state filter takes a state, a phase or a kind (`stopped`)."""
    if state == "stopped":
        return kind_of(result) == "stopped" and matches(result, "", machine)
    return matches(result, state, machine)


def fleet_page(root: str, view: FleetView, state: str, machine: str, page_number: int = 1) -> str:
    query = _query(state, machine, page_number)
    fragment = root + "/fleet" + (f"?{query}" if query else "")
    body = _filters(root, view, state, machine) + f'<div id=fleet data-fragment="{esc(fragment)}">'
    body += fleet_fragment(root, view, state, machine, page_number) + "</div>"
    return page(root, "fleet", body, page_kind="fleet", extra=f' data-live="{esc(root)}/events"')


def _query(state: str, machine: str, page_number: int = 1) -> str:
    pairs = (("state", state), ("machine", machine), ("page", str(page_number) if page_number > 1 else ""))
    return urlencode({key: value for key, value in pairs if value})


def _options(name: str, label: str, values: list[tuple[str, str]], chosen: str) -> str:
    options = f'<option value="">{esc(label)}</option>'
    for value, shown in values:
        selected = " selected" if value == chosen else ""
        options += f'<option value="{esc(value)}"{selected}>{esc(shown)}</option>'
    return f'<label>{esc(name)} <select name="{esc(name)}">{options}</select></label>'


def _filters(root: str, view: FleetView, state: str, machine: str) -> str:
    states = {"running", "stalled", "queued", "waiting", "completed", "failed", "stopped"}
    states |= {result.state for result in view.results} | ({state} if state else set())
    machines = [(row.machine or LOCAL, row.machine or "this machine") for row in view.rows]
    return (
        f'<form id=filters method=get action="{esc(root)}/">'
        + _options("state", "every state", [(s, s) for s in sorted(states)], state)
        + _options("machine", "every machine", machines, machine)
        + " <button type=submit>filter</button></form>"
    )


def fleet_fragment(root: str, view: FleetView, state: str, machine: str, page_number: int = 1) -> str:
    mine = [result for result in view.results if matches(result, "", machine)]
    shown = [result for result in mine if matches_kind(result, state, "")]
    pages = max(1, -(-len(shown) // RUNS_PER_PAGE))
    number = min(max(1, page_number), pages)
    start = (number - 1) * RUNS_PER_PAGE
    table = _run_table(root, shown[start : start + RUNS_PER_PAGE])
    pager = _pager(root, state, machine, number, pages)
    return _machine_table(view.rows) + _counts(root, mine, machine) + table + pager


def _counts(root: str, results: list[Result], machine: str) -> str:
    """How many runs of each kind (of the machine filter's runs), each a link to the runs of that kind."""
    counted = {kind: 0 for kind in KINDS}
    for result in results:
        kind = kind_of(result)
        counted[kind] = counted.get(kind, 0) + 1
    items = "".join(
        f'<li class="count kind-{esc(kind)}" data-kind="{esc(kind)}">'
        f'<a href="{esc(root)}/?{esc(_query(kind, machine))}">{esc(kind)} <b>{number}</b></a></li>'
        for kind, number in counted.items()
        if number or kind in KINDS[:7]
    )
    return f"<ul id=counts>{items}</ul>"


def _pager(root: str, state: str, machine: str, number: int, pages: int) -> str:
    if pages == 1:
        return ""
    links = []
    if number > 1:
        links.append(f'<a rel=prev href="{esc(root)}/?{esc(_query(state, machine, number - 1))}">newer</a>')
    links.append(f"<span>page {number} of {pages}</span>")
    if number < pages:
        links.append(f'<a rel=next href="{esc(root)}/?{esc(_query(state, machine, number + 1))}">older</a>')
    return f'<nav id=pager data-page="{number}" data-pages="{pages}">' + " ".join(links) + "</nav>"


def _machine_table(rows: list[MachineRow]) -> str:
    lines = []
    for row in rows:
        name = row.machine or "this machine"
        if row.skipped:
            status, css = f"skipped: {row.skipped}", "skipped"
        elif row.ok:
            status, css = "ok", "ok"
        else:
            status, css = row.error or "no answer", "error"
        lines.append(
            f'<tr class="{css}" data-machine="{esc(row.machine or LOCAL)}"><td>{esc(name)}</td>'
            f"<td class=status>{esc(status)}</td><td>{row.runs}</td></tr>"
        )
    head = "<tr><th>machine</th><th>status</th><th>runs</th></tr>"
    table = f"<table id=machines>{head}{''.join(lines)}</table>"
    return f"<section><h2>Machines</h2><div class=scroll>{table}</div></section>"


_RUN_COLUMNS = (
    "reference", "machine", "worktree", "harness / profile", "state", "started", "duration", "tokens", "cost",
    "files changed",
)  # fmt: skip


def _run_table(root: str, results: list[Result]) -> str:
    if not results:
        return "<section><h2>Runs</h2><p id=no-runs>no dispatched agent runs</p></section>"
    head = "".join(f"<th>{esc(name)}</th>" for name in _RUN_COLUMNS)
    rows = "".join(_run_row(root, result) for result in results)
    table = f"<table id=runs><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    # In a narrow window the table scrolls sideways in its box; the page itself never does (ui.css).
    return f"<section><h2>Runs</h2><div class=scroll id=runs-box>{table}</div></section>"


def _run_row(root: str, result: Result) -> str:
    ref = ref_of(result)
    where = result.machine or "this machine"
    node = node_of(result)
    if node:
        where += f" (node {node})"
    cells = [
        f'<a href="{esc(run_path(root, ref))}">{esc(ref)}</a>',
        esc(where),
        esc(result.worktree),
        esc(f"{result.resolved.harness} / {result.profile}"),
        f'<span class="state kind-{esc(kind_of(result))}">{esc(shown_state(result))}</span>',
        _relative_time(result.started_at),
        esc(_duration(result)),
        esc(_tokens(result)),
        esc(_cost(result)),
        esc(_files(result)),
    ]
    data = f'data-ref="{esc(ref)}" data-state="{esc(result.state)}" data-phase="{esc(phase_of(result))}"'
    data += f' data-kind="{esc(kind_of(result))}"'
    return f"<tr {data}>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def _relative_time(text: str) -> str:
    """`5m ago`, the absolute local time in its title; ui.js keeps the words current from `datetime`."""
    try:
        moment = parse_rfc3339(text)
    except ValueError:
        return esc(text)
    ago = relative_words(int((utc_now() - moment).total_seconds()))
    return f'<time datetime="{esc(text)}" title="{esc(_local_time(text))}">{esc(ago)}</time>'


def relative_words(seconds: int) -> str:
    """How long ago, in the largest whole unit (the same words ui.js writes)."""
    seconds = max(0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _local_time(text: str) -> str:
    try:
        return parse_rfc3339(text).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return text


def _duration(result: Result) -> str:
    if result.duration_ms is not None:
        return format_duration_ms(result.duration_ms)
    try:
        elapsed = (utc_now() - parse_rfc3339(result.started_at)).total_seconds()
    except ValueError:
        return "-"
    return format_duration_ms(max(0, int(elapsed)) * limits.MS_PER_SECOND) + " so far"


def _tokens(result: Result) -> str:
    usage = result.usage
    return f"{usage.input_tokens + usage.output_tokens:,}" if usage else "-"


def _cost(result: Result) -> str:
    usage = result.usage
    return f"${usage.cost_usd:.4f}" if usage and usage.cost_usd is not None else "-"


def _files(result: Result) -> str:
    changes = result.changes
    if not changes:
        return "-"
    text = str(changes.files_changed)
    if changes.insertions is not None or changes.deletions is not None:
        text += f" (+{changes.insertions or 0} -{changes.deletions or 0})"
    return text


# -- a run's page ----------------------------------------------------------------------------------


def run_page(root: str, ref: str, result: Result | None, error: str | None, actions: str, notice: str = "") -> str:
    path = run_path(root, ref)
    body = f'<h1 id=ref>{esc(ref)}</h1>'
    if notice:
        body += f'<p id=notice class=notice role=status>{esc(notice)}</p>'
    body += f'<section><h2>Facts</h2><div id=facts data-fragment="{esc(path)}/facts">'
    body += facts_fragment(root, ref, result, error) + "</div></section>"
    body += (
        f'<section><h2>Worker actions</h2><pre id=actions data-live="{esc(path)}/actions">'
        f"{esc(actions)}</pre></section>"
    )
    body += (
        f'<section><h2>Diff</h2><p class=links><a id=patch-link href="{esc(path)}/patch">patch</a> · '
        f'<a id=log-link href="{esc(path)}/log">raw log</a></p><div id=diff data-fragment="{esc(path)}/diff">'
    )
    body += '<p class=muted>loading the diff… (<a href="' + esc(path) + '/diff">open it</a>)</p></div>'
    body += (
        f'<form id=review method=post action="{esc(path)}/continue" hidden>'
        "<p class=muted>Click a line of the diff to comment on it; the comments (<code>path:line: comment</code>, "
        "in file order) and the text below become the follow-up task.</p>"
        "<label for=review-task>and</label><textarea id=review-task name=task rows=3></textarea>"
        "<button type=submit>continue with comments</button></form></section>"
    )
    return page(root, ref, body, page_kind="run")


def status_facts(result: Result) -> list[tuple[str, str]]:
    """The facts `wb agent status` (with await's details) prints, as (label, value) pairs; never the task."""
    facts: list[tuple[str, str]] = []
    for line in status_text(result, details=True).splitlines():
        label, value = line[:10].rstrip(), line[10:]
        if label.endswith(":"):
            facts.append((label[:-1], value))
        elif facts:  # a continuation line of a multi-line value (the result)
            facts[-1] = (facts[-1][0], facts[-1][1] + "\n" + value)
    node = node_of(result)
    if node:
        facts.insert(1, ("node", node))
    return facts


def facts_fragment(root: str, ref: str, result: Result | None, error: str | None) -> str:
    if result is None:
        return f"<p class=error id=facts-error>error: {esc(error or 'no answer')}</p>"
    rows = "".join(f"<dt>{esc(label)}</dt><dd>{esc(value)}</dd>" for label, value in status_facts(result))
    out = f'<dl id=status data-state="{esc(result.state)}" data-terminal="{str(result.terminal).lower()}">{rows}</dl>'
    return out + _controls(root, ref, result)


def _controls(root: str, ref: str, result: Result) -> str:
    path = esc(run_path(root, ref))
    if not result.terminal:
        return (
            f'<form id=stop method=post action="{path}/stop" data-confirm="Stop {esc(ref)}? Its worker is signalled.">'
            "<button type=submit>stop this run</button></form>"
        )
    return (
        f'<form id=continue method=post action="{path}/continue"><label for=task>follow-up task</label>'
        "<textarea id=task name=task rows=4 required></textarea>"
        "<button type=submit>continue in the same worktree</button></form>"
    )


def confirm_stop_page(root: str, ref: str) -> str:
    """Without script, a stop asks once more here (with script, the browser's confirm dialog does)."""
    path = esc(run_path(root, ref))
    body = (
        f"<h1>Stop {esc(ref)}?</h1><p>Its worker is signalled and the run recorded as stopped.</p>"
        f'<form id=stop-confirmed method=post action="{path}/stop"><input type=hidden name=confirm value=yes>'
        f'<button type=submit>yes, stop it</button> <a href="{path}">no, back to the run</a></form>'
    )
    return page(root, f"stop {ref}", body, page_kind="confirm")


def message_page(root: str, title: str, message: str, back: str) -> str:
    body = f'<p id=message class=error>{esc(message)}</p><p><a href="{esc(back)}">back</a></p>'
    return page(root, title, body, page_kind="message")


def diff_fragment(diff: DiffResult | None, error: str | None) -> str:
    if diff is None:
        return f"<p class=error id=diff-error>error: {esc(error or 'no answer')}</p>"
    files = files_of(diff)
    if not files:
        return "<p id=no-changes>no changes against the base</p>"
    listing = "".join(
        f'<li><a href="#file-{n}"><span class=add>+{f.insertions}</span> <span class=del>\u2212{f.deletions}</span> '
        f"{esc(f.path)}</a>{' (binary)' if f.binary else ''}</li>"
        for n, f in enumerate(files)
    )
    return f"<ul id=files>{listing}</ul>" + "".join(_file_section(n, f) for n, f in enumerate(files))


def _file_section(number: int, change: FileDiff) -> str:
    out = f'<section class=file id="file-{number}"><h3>{esc(change.path)}'
    if change.status:
        out += f" <span class=muted>({esc(change.status)})</span>"
    out += "</h3>"
    if change.binary:
        return out + "<p class=binary>binary file: not shown</p></section>"
    for hunk in change.hunks:
        lines = "".join(
            f'<span class="line {line.kind}"{_at(change.path, number)}><span class=mark>{_MARKS[line.kind]}</span>'
            f"{esc(line.text)}</span>"
            for line, number in zip(hunk.lines, line_numbers(hunk), strict=True)
        )
        # Each line is a block of its own (ui.css): no newline between them, or the pre doubles them.
        out += f'<pre class=hunk><span class="line hunk-header">{esc(hunk.header)}</span>{lines}</pre>'
    return out + "</section>"


_MARKS = {"add": "+", "del": "\u2212", "ctx": " ", "note": ""}


def _at(path: str, number: str | None) -> str:
    """Where a comment on this line points (`path:12`), for ui.js; none for a `\\ No newline` note."""
    return f' data-at="{esc(f"{path}:{number}")}"' if number else ""


def line_numbers(hunk: Hunk) -> list[str | None]:
    """Each line's number: the new file's for an added or kept line, the old file's (`12 (removed)`) for a
    removed one, from the hunk's `@@ -OLD,N +NEW,M @@`."""
    head = hunk.header.split(" ")
    try:
        old = int(head[1].lstrip("-").split(",")[0])
        new = int(head[2].lstrip("+").split(",")[0])
    except (IndexError, ValueError):
        return [None] * len(hunk.lines)
    out: list[str | None] = []
    for line in hunk.lines:
        if line.kind == "add":
            out.append(str(new))
            new += 1
        elif line.kind == "del":
            out.append(f"{old} (removed)")
            old += 1
        elif line.kind == "ctx":
            out.append(str(new))
            old, new = old + 1, new + 1
        else:
            out.append(None)
    return out
