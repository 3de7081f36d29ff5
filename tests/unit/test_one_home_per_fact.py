"""Each number of protocol/limits.py is written once: no module repeats a bound, an exit code or a unit's
factor as a literal, and git's timeouts are named in courier/runs/git.py (docs/architecture.md, other facts
with one home)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from courier.runs import git
from protocol import limits

REPO = Path(__file__).resolve().parents[2]

# Conversion factors, not bounds: a literal equal to one of them alone is not a repeated limit
# (test_milliseconds_become_seconds_only_through_the_unit keeps the ms factor to its name).
UNITS = {"KIB", "MIB", "MS_PER_SECOND", "MS_PER_MINUTE", "MS_PER_HOUR", "TOKENS_PER_MTOK"}
# Small numbers mean too many other things (counts, exit codes, retries) to be told apart.
SMALLEST_SCANNED = 128

# (file, text) of a message where the quantity is not the bound: an example of a Go duration.
ALLOWED_TEXT = {
    ("courier/cli.py", "168h"),  # "7d is not a Go duration: use 168h"
    ("courier/config.py", "6h"),  # "max_wait must be a duration above 0, such as 6h": any duration would do
}

# (file, value): the same number meaning something else, each with its reason.
ALLOWED = {
    # 128 + a signal number: the shell's exit status of a killed process.
    ("courier/runs/owner.py", 128),
    ("courier/warm/thin_client.py", 128),
    # listen()'s backlog of pending connections.
    ("courier/warm/daemon.py", 128),
    # The end of the descriptor range closed in a child, not a byte count.
    ("courier/runs/process.py", 65536),
    # How much of an exec command's program name a failure message shows, not a bound.
    ("courier/channels/exec.py", 128),
    # The first code point past the BMP, where UTF-16 surrogate pairs start.
    ("courier/text.py", 65536),
    # How often a waiting MCP `await` reports progress, not a bound.
    ("courier/ops/await_.py", 5000),
    # The stand-in Claude's model request: max_tokens of the reply, not bytes.
    ("courier/demo/standin_claude.py", 4096),
    # 0xFF, a byte mask: the stand-in Gemini exits with an HTTP status's low byte (an exit status is one byte).
    ("courier/demo/standin_gemini.py", 255),
    # 0xFF, a byte mask: an octal escape of a git path (`\377`) is one byte.
    ("courier/ui/diffview.py", 255),
    # A peer's schema version past 10**6 is shown as "(out of range)": a display cut, not dollars.
    ("courier/call/decode.py", 1_000_000),
    # The stand-in Claude's own cost estimate, per million tokens as Claude Code's: not wb's price.
    ("courier/demo/standin_claude.py", 1_000_000),
    # Go's duration units in nanoseconds: "us" is 1000 ns, "ms" 1_000_000 ns.
    ("protocol/durations.py", 1000),
    ("protocol/durations.py", 1_000_000),
    # The stand-in Gemini's tool_id carries the clock in ms: a stand-in CLI's output format, not a wb duration.
    ("courier/demo/standin_gemini.py", 1000),
}

# file: reason, where a literal 1000 (or 0.001) may multiply or divide: not a wb duration.
ALLOWED_CONVERSIONS = {
    "courier/demo/standin_gemini.py": "the stand-in's tool_id carries the clock in ms, its own output format",
}

# (file, name): a module-level name of limits defined again elsewhere (another value under the same
# name, as AWAIT_POLL_S was twice), each with its reason. None today.
ALLOWED_REDEFINED: set[tuple[str, str]] = set()


def bounds() -> dict[int | float, list[str]]:
    found: dict[int | float, list[str]] = {}
    for name, value in vars(limits).items():
        if name.isupper() and name not in UNITS and isinstance(value, (int, float)) and value >= SMALLEST_SCANNED:
            found.setdefault(value, []).append(name)
    return found


def _number(node: ast.expr) -> int | float | None:
    """The value of a literal number or of an expression of literals only (`1 << 20`, `64 * 1024`)."""
    if isinstance(node, ast.Constant):
        value = node.value
    elif isinstance(node, (ast.BinOp, ast.UnaryOp)) and all(
        isinstance(inner, (ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)) for inner in ast.walk(node)
    ):
        value = eval(compile(ast.Expression(node), "<literal>", "eval"), {"__builtins__": {}})
    else:
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def literal_bounds(path: Path) -> list[tuple[int, int | float]]:
    """(line, value) of every literal in one file equal to a bound, an expression counted once."""
    known = bounds()
    tree = ast.parse(path.read_text())
    inside: set[int] = set()
    found = []
    for node in ast.walk(tree):
        if id(node) in inside or not isinstance(node, ast.expr):
            continue
        value = _number(node)
        if value is None:
            continue
        inside.update(id(inner) for inner in ast.walk(node))
        if value in known:
            found.append((node.lineno, value))
    return sorted(found)


def _sources() -> list[tuple[str, Path]]:
    """(path from the repository, path) of every module of courier/ and protocol/ but limits.py itself."""
    return [
        (path.relative_to(REPO).as_posix(), path)
        for package in ("courier", "protocol")
        for path in sorted((REPO / package).rglob("*.py"))
        if path.relative_to(REPO).as_posix() != "protocol/limits.py"
    ]


def _names_of(value: int | float, known: dict[int | float, list[str]]) -> str:
    units = [name for name in sorted(UNITS) if getattr(limits, name) == value]
    return " or ".join(f"limits.{name}" for name in known[value] + units)


def test_no_module_repeats_a_bound_of_limits_as_a_literal() -> None:
    known = bounds()
    repeated = []
    used = set()
    for relative, path in _sources():
        for line, value in literal_bounds(path):
            if (relative, value) in ALLOWED:
                used.add((relative, value))
            else:
                repeated.append(f"{relative}:{line}: {value!r} is {_names_of(value, known)}")
    assert not repeated, "\n".join(repeated)
    assert used == ALLOWED, f"ALLOWED entries nothing needs any more, remove them: {sorted(ALLOWED - used)}"


def redefined_names(path: Path) -> list[tuple[int, str]]:
    """(line, name) of each module-level assignment to a name limits defines: a second home, maybe another value."""
    names = {name for name in vars(limits) if name.isupper()}
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        found += [(node.lineno, target.id) for target in targets if isinstance(target, ast.Name) and target.id in names]
    return found


def test_the_redefinition_scan_sees_module_level_names_only(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("AWAIT_POLL_S = 0.5\nX: float = 1.0\nMIB: int = 3\ndef f() -> None:\n    KIB = 2\n")
    assert redefined_names(sample) == [(1, "AWAIT_POLL_S"), (3, "MIB")]


def test_no_module_defines_a_name_of_limits_again() -> None:
    again = []
    used = set()
    for relative, path in _sources():
        for line, name in redefined_names(path):
            if (relative, name) in ALLOWED_REDEFINED:
                used.add((relative, name))
            else:
                again.append(f"{relative}:{line}: {name} is limits.{name} (= {getattr(limits, name)!r})")
    assert not again, "\n".join(again)
    assert used == ALLOWED_REDEFINED, f"ALLOWED_REDEFINED entries nothing needs, remove: {ALLOWED_REDEFINED - used}"


def test_the_scan_sees_folded_expressions_and_plain_numbers(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("CHUNK = 1 << 20\nCAP = 4096\nOTHER = 4095\nX = 2 * 1024 * 1024\n")
    assert literal_bounds(sample) == [(1, 1 << 20), (2, 4096), (4, 2 * 1024 * 1024)]


def test_the_scan_sees_the_facts_that_had_several_homes(tmp_path: Path) -> None:
    """64 MiB in any spelling, the transport and Ctrl-C exits, the cost cap, a base_url's length, max_waits."""
    sample = tmp_path / "sample.py"
    lines = ["64 * 1024 * 1024", "64 << 20", "67108864", "sys.exit(255)", "0xFF", "code = 130", "1_000_000", "2048"]
    sample.write_text("".join(f"{line}\n" for line in [*lines, "le=1000", "x = 254"]))
    assert [line for line, _ in literal_bounds(sample)] == list(range(1, len(lines) + 2))


def _stray_conversions(path: Path) -> list[tuple[int, str]]:
    """(line, source) of each product, quotient or divmod with a literal 1000 or 0.001: a ms/s conversion
    spelled by hand."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)):
            operands = [node.left, node.right]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "divmod":
            operands = list(node.args)
        else:
            continue
        if any(_number(operand) in (limits.MS_PER_SECOND, 1 / limits.MS_PER_SECOND) for operand in operands):
            found.append((node.lineno, ast.get_source_segment(source, node) or ""))
    return sorted(found)


def test_milliseconds_become_seconds_only_through_the_unit() -> None:
    """`ms / limits.MS_PER_SECOND`, `s * limits.MS_PER_SECOND`: never a bare `/ 1000` or `* 1000`."""
    stray = []
    used = set()
    for relative, path in _sources():
        found = _stray_conversions(path)
        if found and relative in ALLOWED_CONVERSIONS:
            used.add(relative)
            continue
        stray += [f"{relative}:{line}: {text} (use limits.MS_PER_SECOND)" for line, text in found]
    assert not stray, "\n".join(stray)
    unused = sorted(set(ALLOWED_CONVERSIONS) - used)
    assert not unused, f"ALLOWED_CONVERSIONS entries nothing needs any more, remove them: {unused}"


def test_the_conversion_scan_sees_every_spelling(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "a = ms / 1000\nb = int(s * 1000)\nc = ms // 1_000\nd = 1000.0 * s\ne = ms * 1e-3\nf = divmod(ms, 1000)\n"
        "g = 6 * 3600 * 1000\nh = ms / limits.MS_PER_SECOND\ni = n * 1024\nj = x[:1000]\n"
    )
    assert [line for line, _ in _stray_conversions(sample)] == [1, 2, 3, 4, 5, 6, 7]


# What each git call may be given as its timeout: a name of courier/runs/git.py.
GIT_TIMEOUTS = {name for name in vars(git) if name.endswith("_TIMEOUT_S")}


def _is_run_git(node: ast.Call) -> bool:
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "run_git") or (
        isinstance(func, ast.Attribute) and func.attr == "run_git"
    )


def _is_git_call(node: ast.Call) -> bool:
    """run_git(…), or a process started with an argv list that begins with "git"."""
    if _is_run_git(node):
        return True
    first = node.args[0] if node.args else None
    return (
        isinstance(first, (ast.List, ast.Tuple))
        and bool(first.elts)
        and isinstance(first.elts[0], ast.Constant)
        and first.elts[0].value == "git"
    )


def unnamed_git_timeouts(path: Path) -> list[tuple[int, str]]:
    """(line, source) of each git call whose timeout is not one of GIT_TIMEOUTS by name."""
    source = path.read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not _is_git_call(node):
            continue
        given = [keyword.value for keyword in node.keywords if keyword.arg == "timeout"]
        if _is_run_git(node) and len(node.args) > 2:
            given.append(node.args[2])  # run_git(args, cwd, timeout)
        for value in given:
            name = value.id if isinstance(value, ast.Name) else value.attr if isinstance(value, ast.Attribute) else None
            if name not in GIT_TIMEOUTS:
                found.append((value.lineno, ast.get_source_segment(source, value) or ""))
    return sorted(found)


def test_every_git_call_names_its_timeout_in_courier_runs_git() -> None:
    unnamed = [
        f"{relative}:{line}: timeout={text} (name one of courier/runs/git.py's {', '.join(sorted(GIT_TIMEOUTS))})"
        for relative, path in _sources()
        for line, text in unnamed_git_timeouts(path)
    ]
    assert not unnamed, "\n".join(unnamed)


def test_the_git_scan_sees_literals_and_names_of_elsewhere(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "run_git(['status'], cwd=d, timeout=30)\n"
        "git.run_git(['status'], d, 60.0)\n"
        "run_git(['status'], cwd=d, timeout=_GIT_TIMEOUT)\n"
        "subprocess.run(['git', 'init'], timeout=60)\n"
        "run_git(['status'], cwd=d, timeout=CLONE_TIMEOUT_S)\n"
        "run_git(['status'], d, git.PATCH_TIMEOUT_S)\n"
        "run_git(['status'], cwd=d)\n"
        "subprocess.run(['ls'], timeout=60)\n"
        "subprocess.Popen(['git', 'status'], 1, 60)\n"
    )
    assert [line for line, _ in unnamed_git_timeouts(sample)] == [1, 2, 3, 4]


# "30m" is left out: it is the example duration of many messages, not a bound written out.
_QUANTITY = re.compile(r"\b(\d+) ?(MiB|KiB|h|min)\b")
_UNIT = {"MiB": limits.MIB, "KiB": limits.KIB, "h": limits.MS_PER_HOUR, "min": limits.MS_PER_MINUTE}


def _docstrings(tree: ast.Module) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def written_bounds(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every "1 MiB", "168h", "5 min" in a message (docstrings aside) that is a bound's value."""
    known = {
        value for name, value in vars(limits).items() if name.endswith(("_BYTES", "_MS")) and isinstance(value, int)
    }
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            for number, unit in _QUANTITY.findall(node.value):
                if int(number) * _UNIT[unit] in known:
                    found.append((node.lineno, f"{number}{' ' if unit in ('MiB', 'KiB', 'min') else ''}{unit}"))
    return found


def test_no_message_writes_a_bound_out_by_hand() -> None:
    written = []
    for package in ("courier", "protocol"):
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            written += [
                f"{relative}:{line}: {text}"
                for line, text in written_bounds(path)
                if (relative, text) not in ALLOWED_TEXT
            ]
    assert not written, "\n".join(written)


def test_a_request_is_built_only_by_remote_request_of() -> None:
    """`RemoteRequest.of` stamps this wb's schema version; no module spells the constructor itself."""
    builders = []
    for path in sorted((REPO / "courier").rglob("*.py")) + sorted((REPO / "protocol").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "RemoteRequest":
                builders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not builders, f"build requests with RemoteRequest.of: {builders}"
