"""The run page's diff cut into files and hunks (courier/ui/diffview.py, docs/ui.md)."""

from __future__ import annotations

from courier.ui.diffview import files_of
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
