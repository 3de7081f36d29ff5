"""Each bound of protocol/limits.py is written once: no module repeats its number as a literal."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from protocol import limits

REPO = Path(__file__).resolve().parents[2]

# Conversion factors, not bounds: a `/ 1000` turning ms into seconds is not a repeated limit.
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
    # Milliseconds to seconds and a 1 s poll: courier/executor/ray_head.py is being rewritten (issue 33's
    # second pass) and takes limits.MS_PER_SECOND there; this entry goes with that rewrite.
    ("courier/executor/ray_head.py", 1000),
}


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
    return found


def test_no_module_repeats_a_bound_of_limits_as_a_literal() -> None:
    known = bounds()
    repeated = []
    for package in ("courier", "protocol"):
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative == "protocol/limits.py":
                continue
            for line, value in literal_bounds(path):
                if (relative, value) not in ALLOWED:
                    repeated.append(f"{relative}:{line}: {value!r} is limits.{' or limits.'.join(known[value])}")
    assert not repeated, "\n".join(repeated)


def test_the_scan_sees_folded_expressions_and_plain_numbers(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("CHUNK = 1 << 20\nCAP = 4096\nOTHER = 4095\nX = 2 * 1024 * 1024\n")
    assert literal_bounds(sample) == [(1, 1 << 20), (2, 4096), (4, 2 * 1024 * 1024)]


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
