"""The run page's diff cut into files and hunks (courier/ui/diffview.py, docs/ui.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from courier.ui.diffview import files_of, split_patch, unquote_path
from courier.ui.pages import diff_fragment
from protocol.models import DiffFile, DiffResult

PATCH = """diff --git a/a.txt b/a.txt
index 1111111..2222222 100644
--- a/a.txt
+++ b/a.txt
@@ -1,2 +1,2 @@
 same
-old <b>
+new <script>x()</script>
\\ No newline at end of file
@@ -10 +10,2 @@ def f():
+added
diff --git a/logo.png b/logo.png
new file mode 100644
index 0000000..3333333
Binary files /dev/null and b/logo.png differ
"""


def _diff() -> DiffResult:
    files = [
        DiffFile(path="a.txt", status="modified", insertions=2, deletions=1),
        DiffFile(path="logo.png", status="added", binary=True),
    ]
    return DiffResult(agent_id="agt-" + "0" * 32, base_sha="a" * 40, head_sha="b" * 40, files=files, patch=PATCH)


def test_each_file_has_its_hunks_and_lines_marked_and_a_binary_file_is_named() -> None:
    text, binary = files_of(_diff())
    assert (text.path, text.insertions, text.deletions, text.binary) == ("a.txt", 2, 1, False)
    assert [hunk.header for hunk in text.hunks] == ["@@ -1,2 +1,2 @@", "@@ -10 +10,2 @@ def f():"]
    assert [(line.kind, line.text) for line in text.hunks[0].lines] == [
        ("ctx", "same"), ("del", "old <b>"), ("add", "new <script>x()</script>"),
        ("note", "\\ No newline at end of file"),
    ]  # fmt: skip
    assert binary.path == "logo.png" and binary.binary and binary.hunks == []


def test_the_rendered_diff_escapes_every_line_and_path() -> None:
    html = diff_fragment(_diff(), None)
    assert "<script>" not in html and "<b>" not in html
    assert "new &lt;script&gt;x()&lt;/script&gt;" in html and "old &lt;b&gt;" in html
    assert "binary file: not shown" in html and "+2</span>" in html


# -- paths git quotes, from real git output --------------------------------------------------------

QUOTED_NAMES = [
    "a b/c.txt", 'q"uote.txt', "caf\u00e9.txt", "new\nline.txt", "sp ace.txt", "back\\slash.txt", "plain.txt"
]  # fmt: skip


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, check=True)
    return done.stdout.decode("utf-8", "surrogateescape")


def _repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    for name in ("gone with space.txt", "kept.txt"):
        (repo / name).write_text(f"old {name}\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    return repo, _git(repo, "rev-parse", "HEAD").strip()


def test_every_file_whose_path_git_quotes_shows_its_own_hunks_under_its_real_name(tmp_path: Path) -> None:
    from courier.runs.patch import compute_diff

    repo, base = _repo(tmp_path)
    for name in QUOTED_NAMES:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(f"content of {name!r}\n")
    (repo / "bin \u00e4.dat").write_bytes(b"\0\1\2binary")
    (repo / "gone with space.txt").unlink()
    (repo / "kept.txt").write_text("new kept.txt\n")
    made = compute_diff(str(repo), base)
    assert b'"b/q\\"uote.txt"' in made.patch and b"caf\\303\\251" in made.patch  # git did quote them
    files = [DiffFile(**change.to_wire()) for change in made.files]  # type: ignore[arg-type]
    diff = DiffResult(agent_id="agt-" + "0" * 32, base_sha=base, head_sha=base, files=files,
                      patch=made.patch.decode("utf-8", "surrogateescape"))  # fmt: skip
    shown = {change.path: change for change in files_of(diff)}
    expected = {*QUOTED_NAMES, "bin \u00e4.dat", "gone with space.txt", "kept.txt"}
    assert set(shown) == expected  # no phantom file (`c.txt`), none missing
    for name in QUOTED_NAMES:
        (hunk,) = shown[name].hunks
        assert [(line.kind, line.text) for line in hunk.lines] == [("add", f"content of {name!r}")], name
    assert [line.text for line in shown["gone with space.txt"].hunks[0].lines] == ["old gone with space.txt"]
    assert [line.kind for line in shown["kept.txt"].hunks[0].lines] == ["del", "add"]
    assert shown["bin \u00e4.dat"].binary and shown["bin \u00e4.dat"].hunks == []


def test_renames_and_copies_take_the_new_name_and_quoted_header_lines_are_read(tmp_path: Path) -> None:
    repo, _ = _repo(tmp_path)
    _git(repo, "mv", "gone with space.txt", 'r\u00e9named "it".txt')
    (repo / 'r\u00e9named "it".txt').write_text("old gone with space.txt\nand more\n")
    _git(repo, "add", "-A")
    patch = _git(repo, "-c", "core.quotePath=true", "diff", "--cached", "-M", "--src-prefix=a/", "--dst-prefix=b/")
    assert "rename to " in patch
    (block,) = split_patch(patch)
    assert block[0] == 'r\u00e9named "it".txt'
    assert unquote_path('"a\\tb\\\\c\\"d\\303\\251" rest') == ('a\tb\\c"d\u00e9', " rest")
    assert unquote_path("plain name.txt") == ("plain name.txt", "")


def test_a_header_without_hunk_markers_is_still_named_right() -> None:
    patch = (
        'diff --git "a/x\\"y" "b/x\\"y"\nold mode 100644\nnew mode 100755\n'
        "diff --git a/a b/c.txt b/a b/c.txt\nold mode 100644\nnew mode 100755\n"
    )
    assert [path for path, _ in split_patch(patch)] == ['x"y', "a b/c.txt"]
