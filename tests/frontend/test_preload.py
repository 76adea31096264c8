"""index.html preloads every ES module the page imports (no browser needed): the browser fetched main.js, parsed
it, and only then asked for its 18 imports, one round trip more before the first plan (at load 11-15 the last
module was requested 1.22 s after navigation, median of 5; with the preloads 0.24 s)."""

from __future__ import annotations

import re
from pathlib import Path

JS = Path(__file__).resolve().parents[2] / "frontend" / "js"
INDEX = JS.parent / "index.html"


def imported_from(entry: str) -> set[str]:
    """The modules entry imports, transitively (static `import ... from "./x.js"` only)."""
    seen, todo = set(), [entry]
    while todo:
        text = (JS / todo.pop()).read_text()
        for name in re.findall(r'^import[^;]*?from "\./([\w-]+\.js)"', text, re.M | re.S):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def test_every_imported_module_is_preloaded_and_nothing_else():
    preloaded = set(re.findall(r'<link rel="modulepreload" href="/static/js/([\w-]+\.js)">', INDEX.read_text()))
    imported = imported_from("main.js")
    assert len(imported) >= 18 and "timeline.js" in imported  # the walk reaches the views main.js pulls in
    assert preloaded == imported, (imported - preloaded, preloaded - imported)
