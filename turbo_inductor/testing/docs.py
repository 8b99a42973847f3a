"""The documentation's generated sections: the text between ``<!-- generated: NAME -->`` and ``<!-- end: NAME -->``
in a file of the repository is what the code makes now. The tests check it; ``UPDATE_DOCS=1`` rewrites it."""

from __future__ import annotations

import os
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def generated(path: str, name: str, body: str) -> None:
    """The text between ``<!-- generated: name -->`` and ``<!-- end: name -->`` in ``path`` (from the repository's
    root) is ``body``: asserted, or with ``UPDATE_DOCS`` set written."""
    file = ROOT / path
    text = file.read_text()
    pattern = re.compile(rf"(<!-- generated: {name} -->\n)(.*?)(<!-- end: {name} -->)", re.S)
    match = pattern.search(text)
    assert match, f"{path} has no generated {name!r} section"
    if os.environ.get("UPDATE_DOCS"):
        file.write_text(text[: match.start(2)] + body + "\n" + text[match.end(2) :])
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0] or "the test"
    assert match.group(2) == body + "\n", f"{path}: the {name} is stale; run UPDATE_DOCS=1 pytest {test}"
