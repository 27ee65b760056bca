"""Every relative link and image of README.md and docs/*.md points to a file of the repository, and every
``#anchor`` to a heading of that file (GitHub's slugs: lower case, punctuation dropped, spaces to hyphens)."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slugs(path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a "# comment" in a code block is no heading
    headings = re.findall(r"^#+ (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_relative_links_reach_a_file_and_a_heading(document):
    text = re.sub(r"```.*?```", "", document.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        path = (document.parent / file).resolve() if file else document
        assert path.exists(), f"{document.name}: {target}"
        if anchor:
            assert anchor in slugs(path), f"{document.name}: {target} (headings: {sorted(slugs(path))})"
