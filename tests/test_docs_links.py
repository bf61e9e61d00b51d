"""Every relative link and every ``#anchor`` in README.md and docs/*.md resolves.

Anchors are computed as GitHub computes them: the heading's text (inline code, emphasis and link
syntax reduced to their text), lowercased, punctuation dropped, spaces turned into hyphens; a
repeated slug gets ``-1``, ``-2``, ... in order of appearance.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); a target may carry a "title" after a space
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"`[^`]*`")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def github_slug(heading: str) -> str:
    """GitHub's anchor for one heading's text (without the duplicate suffix)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images keep their text
    text = text.replace("`", "")
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)  # drop punctuation; keep letters, digits, _, -, spaces
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub makes for ``path``'s headings, duplicates numbered."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        m = HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        if slug in seen:
            seen[slug] += 1
            out.add(f"{slug}-{seen[slug]}")
        else:
            seen[slug] = 0
            out.add(slug)
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link outside code blocks and inline code."""
    out = []
    for n, line in _prose_lines(path.read_text(encoding="utf-8")):
        for m in LINK.finditer(INLINE_CODE.sub("", line)):
            out.append((n, m.group(1)))
    return out


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """What in ``path`` does not resolve: missing files and missing anchors, as ``file:line: target``."""
    problems = []
    for n, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{n}: {target}"
        if not dest.exists():
            problems.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where} (no heading with anchor #{anchor} in {dest.relative_to(root)})")
    return problems


def test_slugs_follow_github() -> None:
    """Worked by hand from GitHub's rule (github-slugger) for headings like the project's."""
    assert github_slug("One SCORE step") == "one-score-step"
    assert github_slug("Do the cold start's scores carry signal?") == "do-the-cold-starts-scores-carry-signal"
    assert github_slug("Cold start (SFT) and the learning default") == "cold-start-sft-and-the-learning-default"
    gpu_check = "One GPU: `scripts/gpu_check.sh` and the GPU tests"
    assert github_slug(gpu_check) == "one-gpu-scriptsgpu_checksh-and-the-gpu-tests"
    assert github_slug("The paper's recipe (`experiment=qwen_score`)") == "the-papers-recipe-experimentqwen_score"
    assert github_slug("2026-11-30: GRPO step vs TRL") == "2026-11-30-grpo-step-vs-trl"
    assert github_slug("1. Generate articles") == "1-generate-articles"


def test_duplicate_headings_are_numbered(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# Command\n\n## Command\n\n```\n# Command\n```\n\n## Command\n", encoding="utf-8")
    assert anchors(page) == {"command", "command-1", "command-2"}


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    """The check must fail on a missing file and on a missing anchor, and pass links in code."""
    (tmp_path / "other.md").write_text("# Real heading\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Top\n[ok](other.md#real-heading) [self](#top) [web](https://example.org/x#y)\n"
        "[gone](missing.md) [bad](other.md#no-such-heading) [badself](#nowhere)\n"
        "`[in code](missing2.md)`\n```\n[fenced](missing3.md)\n```\n",
        encoding="utf-8",
    )
    problems = broken_links(page, root=tmp_path)
    assert len(problems) == 3, problems
    assert "missing.md (no such file)" in problems[0]
    assert "#no-such-heading" in problems[1] and "#nowhere" in problems[2]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(path: Path) -> None:
    assert not broken_links(path), "\n".join(broken_links(path))


def test_readme_fits_one_screen() -> None:
    """Issue 28: README.md is the first screen (at most 160 lines); the manual is docs/."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 160
