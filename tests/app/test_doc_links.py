"""Every relative link in README.md and docs/*.md leads somewhere: the file exists in the repository and a
`#anchor` is one of the target's headings, slugged as GitHub slugs them (lower case, punctuation dropped, spaces
to hyphens, a repeated heading numbered -1, -2). The README was rewritten in round five and its history moved to
docs/history.md; a link that lost its section is found here, not by a reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target), not images


def slugs(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file (headings inside fenced code are not headings)."""
    out: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        text = re.sub(r"[`*]|<[^>]+>", "", line.lstrip("#").strip())
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    found, fenced = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        if not fenced:
            found += [(number, target) for target in LINK.findall(line)]
    return found


def test_the_slugs_are_githubs():
    """The anchors the docs already link to, as GitHub writes them (punctuation such as '/', ',' and ':' goes,
    the hyphens and underscores of the heading stay)."""
    assert "issue-19-item-1-one-model-beforeafter" in slugs(ROOT / "docs" / "search.md")
    assert "the-largest-plan-accepted-per-network-issue-26-item-2" in slugs(ROOT / "docs" / "hardening.md")


def broken_links(doc: Path) -> list[str]:
    broken = []
    for number, target in links(doc):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto: are not checked here (no network)
            continue
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{doc.name}:{number}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in slugs(dest):
            broken.append(f"{doc.name}:{number}: {target} (no heading #{anchor} in {dest.name})")
    return broken


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# A\n## Two words, and more\n[ok](#two-words-and-more) [gone](b.md)\n"
                                   "[lost](#two-words) ![img](none.png)\n```\n[in code](c.md)\n```\n")  # fmt: skip
    assert broken_links(tmp_path / "a.md") == ["a.md:3: b.md (no such file)",
                                               "a.md:4: #two-words (no heading #two-words in a.md)"]  # fmt: skip


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path):
    broken = broken_links(doc)
    assert not broken, "\n".join(broken)
