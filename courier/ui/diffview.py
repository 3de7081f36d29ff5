"""A run's patch cut into files and hunks for the run page (docs/ui.md, the run's page).

Pure text work on the patch `wb agent diff` prints; nothing here escapes (pages.py does),
so the parser can be tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.models import DiffResult


@dataclass
class Line:
    kind: str  # "add", "del", "ctx" or "note" (`\ No newline at end of file`)
    text: str


@dataclass
class Hunk:
    header: str
    lines: list[Line] = field(default_factory=list)


@dataclass
class FileDiff:
    path: str
    status: str = ""
    insertions: int = 0
    deletions: int = 0
    binary: bool = False
    hunks: list[Hunk] = field(default_factory=list)


_GIT_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _decode(data: bytearray | bytes) -> str:
    return bytes(data).decode("utf-8", "surrogateescape")


def unquote_path(text: str) -> tuple[str, str]:
    """(the path, the rest of the line) of a path git may have C-quoted (`"a\\"b\\303\\251.txt"`).

    core.quotePath (the patch is made with it on) quotes a path holding a control character, a
    quote, a backslash or a non-ASCII byte (as octal escapes of its UTF-8 bytes); an unquoted
    path is returned whole, for the caller to cut.
    """
    if not text.startswith('"'):
        return text, ""
    out = bytearray()
    position = 1
    while position < len(text):
        char = text[position]
        if char == '"':
            return _decode(out), text[position + 1 :]
        if char == "\\" and position + 1 < len(text):
            following = text[position + 1]
            if following in "01234567" and position + 3 < len(text):
                out.append(int(text[position + 1 : position + 4], 8) & 0xFF)
                position += 4
                continue
            out.append(_GIT_ESCAPES.get(following, ord(following) if following.isascii() else 63))
            position += 2
            continue
        out += char.encode("utf-8", "surrogateescape")
        position += 1
    return text, ""  # no closing quote: not git's quoting after all


def _strip_prefix(path: str, prefix: str) -> str | None:
    return path[len(prefix) :] if path.startswith(prefix) else None


def _header_path(rest: str) -> str:
    """The file of `diff --git <rest>`: `a/P b/P` (P unquoted, perhaps with spaces) or quoted names."""
    if rest.startswith('"'):
        first, tail = unquote_path(rest)
        second, _ = unquote_path(tail.lstrip(" "))
        return _strip_prefix(second, "b/") or _strip_prefix(first, "a/") or second
    if rest.endswith('"'):  # an unquoted old name, a quoted new one
        cut = rest.rfind(' "')
        second, _ = unquote_path(rest[cut + 1 :])
        return _strip_prefix(second, "b/") or second
    # Both names unquoted: the same path twice (no renames), so the line is `a/` + P + ` b/` + P.
    half = (len(rest) - len("a/ b/")) // 2
    if half >= 0 and rest[: 2 + half] == "a/" + rest[2 + half + 3 :] and rest[2 + half : 2 + half + 3] == " b/":
        return rest[2 : 2 + half]
    return rest.rsplit(" b/", 1)[-1]


def _marker_path(rest: str, prefix: str) -> str | None:
    """The path of a `--- a/P` or `+++ b/P` line; None for /dev/null (git ends a path with a space with a tab)."""
    if rest.startswith('"'):
        path, _ = unquote_path(rest)
    else:
        path = rest[:-1] if rest.endswith("\t") else rest
    if path == "/dev/null":
        return None
    return _strip_prefix(path, prefix) or path


def _named_path(lines: list[str]) -> str | None:
    """The file's name from the lines before its first hunk: the new name, else the old (a deleted file)."""
    new = old = None
    for line in lines:
        if line.startswith("@@"):
            break
        if line.startswith("+++ "):
            new = _marker_path(line[4:], "b/")
        elif line.startswith("--- "):
            old = _marker_path(line[4:], "a/")
        elif line.startswith(("rename to ", "copy to ")):
            new = unquote_path(line.split(" to ", 1)[1])[0]
    return new or old


def split_patch(patch: str) -> list[tuple[str, list[str]]]:
    """(path, the file's lines) per `diff --git` block, in the patch's order, each under its real name."""
    blocks: list[tuple[str, list[str]]] = []
    for line in patch.split("\n"):
        if line.startswith("diff --git "):
            blocks.append((_header_path(line[len("diff --git ") :]), []))
        elif blocks:
            blocks[-1][1].append(line)
    return [(_named_path(lines) or path, lines) for path, lines in blocks]


def _hunks(lines: list[str]) -> tuple[list[Hunk], bool]:
    hunks: list[Hunk] = []
    binary = False
    for line in lines:
        if line.startswith("@@"):
            hunks.append(Hunk(line))
        elif not hunks:
            binary = binary or line.startswith("Binary files ") or line == "GIT binary patch"
        elif line.startswith("+"):
            hunks[-1].lines.append(Line("add", line[1:]))
        elif line.startswith("-"):
            hunks[-1].lines.append(Line("del", line[1:]))
        elif line.startswith("\\"):
            hunks[-1].lines.append(Line("note", line))
        elif line.startswith(" "):
            hunks[-1].lines.append(Line("ctx", line[1:]))
    return hunks, binary


def files_of(diff: DiffResult) -> list[FileDiff]:
    """Every changed file with its counts (from the reply's file list) and its hunks (from the patch)."""
    parsed = {path: _hunks(lines) for path, lines in split_patch(diff.patch or "")}
    out = []
    for change in diff.files:
        hunks, binary = parsed.pop(change.path, ([], False))
        out.append(
            FileDiff(
                change.path,
                change.status,
                change.insertions,
                change.deletions,
                change.binary or binary,
                [] if change.binary else hunks,
            )
        )
    for path, (hunks, binary) in parsed.items():  # in the patch but not the list (a renamed file's old name)
        out.append(FileDiff(path, "", 0, 0, binary, hunks))
    return out
