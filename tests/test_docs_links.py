"""Every relative link and every ``#anchor`` in README.md, docs/*.md and docs/studies/*.md resolves, and the first
pages stay short: the README a newcomer reads (no wall of intervals, one-line recipe rows) and BENCHMARKS.md's
current figures, with every study on its own page under docs/studies/ (issue 72).

Anchors are computed as GitHub computes them: the heading's text (inline code, emphasis and link
syntax reduced to their text), lowercased, punctuation dropped, spaces turned into hyphens; a
repeated slug gets ``-1``, ``-2``, ... in order of appearance.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "studies").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); a target may carry a "title" after a space; the text may wrap onto the next
# lines of its paragraph (a blank line ends it)
LINK = re.compile(r"!?\[(?:[^\]\\\n]|\\.|\n(?![ \t]*\n))*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
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
    """(line of the target, target) of every Markdown link outside code blocks and inline code, a link whose text
    wraps over lines included (the prose is read whole, code blocks blanked, so line numbers stay true)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    prose = dict(_prose_lines("\n".join(lines)))
    text = "\n".join(INLINE_CODE.sub("", prose[n]) if n in prose else "" for n in range(1, len(lines) + 1))
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in LINK.finditer(text)]


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


def test_a_link_wrapped_over_two_lines_is_checked(tmp_path: Path) -> None:
    """A link whose text wraps (common in prose kept at 120 columns) is checked as any other; a blank line ends it."""
    (tmp_path / "other.md").write_text("# Real heading\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Top\nSee [the other page's\nheading](other.md#gone) and [a fine\none](other.md#real-heading).\n\n"
                    "[not a link\n\n](missing.md)\n", encoding="utf-8")
    assert links(page) == [(3, "other.md#gone"), (4, "other.md#real-heading")]
    assert broken_links(page, root=tmp_path) == ["page.md:3: other.md#gone (no heading with anchor #gone in other.md)"]


_NUM = r"[+\-−]?\d+(?:\.\d+)?"
#: a confidence interval as the project writes one: [lo, hi], ± half-width, "lo to hi", "interval lo–hi"
INTERVAL = re.compile(rf"\[\s*{_NUM}\s*,\s*{_NUM}\s*\]|±\s*\d|{_NUM}\.\d+\s+to\s+{_NUM}\.\d+"
                      rf"|interval\s+{_NUM}\s*[–-]\s*{_NUM}")
RECIPE_ROW_CHARS = 130  # a recipe row as rendered (link targets and backticks dropped) fits one line of a screen


def intervals(text: str) -> list[int]:
    """The line of every confidence interval in ``text``."""
    return [text.count("\n", 0, m.start()) + 1 for m in INTERVAL.finditer(text)]


def test_intervals_are_counted_as_written() -> None:
    text = ("a [0.365, 0.763] b −0.030 [−0.051, −0.008]\nc +0.006 ± 0.237, (+0.046 to +0.217)\n"
            "d 95% interval 0.131–0.244\nnot: seeds 31–35, [docs](x.md), 0.63–0.73, [1], K ∈ {2, 4}, 2 to 3 steps\n")
    assert intervals(text) == [1, 1, 2, 2, 3]


def _rendered(row: str) -> str:
    return re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", row).replace("`", "")


def test_readme_is_read_in_two_minutes() -> None:
    """Issue 72: the README is no results section: at most three confidence intervals, none on its first screen (60
    lines), and each row of its recipes table is one line; the figures live in docs/BENCHMARKS.md and docs/studies/."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = intervals(text)
    assert len(found) <= 3, f"README.md has {len(found)} confidence intervals, on lines {found}"
    assert not [n for n in found if n <= 60], f"intervals on the README's first 60 lines: {found}"
    lines = text.splitlines()
    section = lines[lines.index("## Recipes") + 1:]
    section = section[: next((i for i, ln in enumerate(section) if ln.startswith("## ")), len(section))]
    first = next(i for i, ln in enumerate(section) if ln.startswith("|"))
    table = section[first: next((i for i in range(first, len(section)) if not section[i].startswith("|")), None)]
    assert len(table) >= 5, "the README lists its recipes in a table under '## Recipes'"
    long = [(len(_rendered(r)), r[:60]) for r in table if len(_rendered(r)) > RECIPE_ROW_CHARS]
    assert not long, f"recipe rows longer than one line ({RECIPE_ROW_CHARS} characters): {long}"


def test_benchmarks_holds_current_figures_and_the_studies_have_an_index() -> None:
    """Issue 72: docs/BENCHMARKS.md is a few screens of current figures; every study and measurement is its own page
    under docs/studies/, and docs/studies/README.md links each one."""
    assert len((ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()) <= 400
    index = ROOT / "docs" / "studies" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve() for _, t in links(index)}
    pages = {p.resolve() for p in (ROOT / "docs" / "studies").glob("*.md")} - {index.resolve()}
    assert len(pages) >= 5 and not pages - linked, f"not in docs/studies/README.md: {sorted(p.name for p in pages - linked)}"
