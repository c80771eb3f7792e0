"""README.md and docs/*.md link to each other: every relative link must resolve, to a file that exists and, where it
names an anchor, to a heading of that file as GitHub slugs it. And the README stays short (issue 18: at most about
12 KB; the rest lives in docs/)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

from helpers import REPO

README_MAX_BYTES = 12_500

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`]+`")
# [text](target) and ![alt](target); the text may span lines but holds no brackets of its own
LINK = re.compile(r"!?\[[^\[\]]*\]\(([^()\s]*)\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)


def _documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _without_code_blocks(text: str) -> str:
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (keeping '-' and '_'), spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading reads as its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub makes for the file's headings; a repeated heading gets -1, -2, ... as GitHub numbers it."""
    seen: dict[str, int] = {}
    out = set()
    for _, title in HEADING.findall(_without_code_blocks(path.read_text())):
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    text = _without_code_blocks(path.read_text())
    # a link's text may be code (`hetbench split`); drop code spans that are not inside a link's target
    text = CODE_SPAN.sub("code", text)
    return LINK.findall(text)


def _is_external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)) or target.startswith("//")


def test_slug_follows_github():
    assert slug("`hetbench train --frontend torch`") == "hetbench-train---frontend-torch"
    assert slug("Uneven FSDP: `shard_module` and `--strategy fsdp`") == "uneven-fsdp-shard_module-and---strategy-fsdp"
    assert slug("Running on two nodes (an NVIDIA node and an AMD node)") == \
        "running-on-two-nodes-an-nvidia-node-and-an-amd-node"
    assert slug("Overhead: `make bench`") == "overhead-make-bench"
    assert slug("The two paths: `--path host|device|both`") == "the-two-paths---path-hostdeviceboth"
    assert slug("Files, folders and v1.2") == "files-folders-and-v12"


def test_links_are_found_across_lines_and_outside_code():
    doc = REPO / "README.md"
    assert links(doc), "README.md has no links at all: the link pattern is broken"
    sample = "see [the\nsplit page](docs/split.md#weights) and ![a plot](docs/x.png)\n```\n[not](a-link.md)\n```\n"
    text = CODE_SPAN.sub("code", _without_code_blocks(sample))
    assert LINK.findall(text) == ["docs/split.md#weights", "docs/x.png"]


def test_every_relative_link_resolves():
    broken = []
    checked = 0
    for doc in _documents():
        for target in links(doc):
            if not target or _is_external(target):
                continue
            checked += 1
            file_part, _, anchor = target.partition("#")
            dest = (doc.parent / unquote(file_part)).resolve() if file_part else doc
            where = f"{doc.relative_to(REPO)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file")
                continue
            if anchor:
                if dest.suffix != ".md":
                    broken.append(f"{where}: an anchor into a file that is not markdown")
                elif anchor not in anchors(dest):
                    broken.append(f"{where}: no heading with anchor #{anchor}")
    assert checked > 30, checked
    assert not broken, "\n".join(broken)


def test_readme_is_short():
    size = (REPO / "README.md").stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; at most {README_MAX_BYTES}: move detail to docs/"


def test_every_docs_page_is_linked_from_the_readme():
    readme_targets = {t.partition("#")[0] for t in links(REPO / "README.md")}
    unlinked = [p.name for p in sorted((REPO / "docs").glob("*.md")) if f"docs/{p.name}" not in readme_targets]
    assert not unlinked, unlinked
