"""The documentation's links resolve, the README stays a front page, and CI runs the README's tests.

Pure: reads the markdown files of the repository, runs nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_LINES = 200  # a front page; the guide and the reference live in docs/

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def doc_files() -> list[Path]:
    """The pages whose links must resolve: the README, docs/ and the benchmarks' index."""
    return [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]


def _prose(text: str) -> str:
    """The text without fenced blocks and inline code, where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(text: str) -> list[str]:
    """Every link target of a markdown text: inline links, images and reference definitions."""
    prose = _prose(text)
    return INLINE_LINK.findall(prose) + REFERENCE_DEF.findall(prose)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors a markdown file offers, numbered as GitHub numbers repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file, or whose anchor in a markdown file, does not exist."""
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(ROOT)}")
    return broken


@pytest.mark.parametrize("page", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert page.exists(), f"{page.relative_to(ROOT)} is missing"
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)} links to what is not there:\n" + "\n".join(broken)


def test_readme_is_a_front_page() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n < README_MAX_LINES, (
        f"README.md has {n} lines; keep it under {README_MAX_LINES} and move the rest to a page in docs/")


def _commands(lines: list[str]) -> list[str]:
    """Shell commands of a script or a code block: comments and blank lines dropped, pip's -q ignored."""
    out = []
    for line in lines:
        line = line.split("  #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(re.sub(r"^pip install -q ", "pip install ", line))
    return out


def test_ci_runs_the_readme_test_commands() -> None:
    """.ci/run installs as the README says and runs the README's test commands, in that order."""
    ci = _commands((ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines())
    ci = [c for c in ci if c.startswith(("pip ", "python "))]
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)
    readme = [c for block in blocks for c in _commands(block.splitlines())]
    install = [c for c in ci if c.startswith("pip ")]
    tests = [c for c in ci if c.startswith("python ")]
    assert install and all(c in readme for c in install), f"the README does not show CI's install: {install}"
    block_of_tests = next((_commands(b.splitlines()) for b in blocks if _commands(b.splitlines()) == tests), None)
    assert block_of_tests is not None, f"the README has no block with CI's test commands exactly: {tests}"
