"""README.md is a user's page and docs/ the reference: every relative link and anchor in them resolves, the README
stays short and reaches every page of docs/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md")), REPO / "deploy" / "README.md"]
README_MAX_LINES = 400

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and code spans (a link or heading there is not one)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).replace("`", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", page.read_text()), re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text()))


def broken(page: Path) -> list[str]:
    problems = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:: not checked offline
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{target}: no {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: {dest.name} has no heading with anchor #{anchor}")
    return problems


def test_the_slug_is_githubs():
    assert slug("Capacity planning: `kvwatch plan`") == "capacity-planning-kvwatch-plan"
    assert slug("`/api/v1/history`") == "apiv1history"
    assert slug("Deploy to Kubernetes in three steps") == "deploy-to-kubernetes-in-three-steps"
    assert slug("raise_max_num_seqs") == "raise_max_num_seqs"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken(page) == []


def test_the_check_finds_a_broken_link_and_a_broken_anchor(tmp_path):
    (tmp_path / "a.md").write_text(
        "# A\n\n## Two words\n\n[ok](#two-words) [ok](b.md#b) `[not a link](nowhere.md)`\n"
        "[gone](missing.md) [bad anchor](b.md#nope) ![picture](c.png)\n"
    )
    (tmp_path / "b.md").write_text("# B\n\n```\n# not a heading\n```\n")
    assert [p.split(":")[0] for p in broken(tmp_path / "a.md")] == ["missing.md", "b.md#nope", "c.png"]


def test_the_readme_is_short_and_reaches_every_page_of_docs():
    text = README.read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, f"README.md has {len(text.splitlines())} lines"
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in links(README)}
    assert {p for p in PAGES if p.parent.name == "docs"} - linked == set(), "a page of docs/ the README never names"
    assert (REPO / "docs" / "status-page.png").resolve() in linked, "the README shows the status page"
