"""Every link, anchor, section reference and table in README.md, CHANGELOG.rst and docs/ holds.

- a relative link (``[text](docs/x.md)``, an image) names a file that exists, and is not a link of
  a page to itself;
- an anchor (``#heading``, ``x.md#heading``) names a heading of that page, by GitHub's rule
  (lowercase; punctuation other than ``-`` and ``_`` removed; spaces -> ``-``; a repeated heading
  gets ``-1``, ``-2``);
- a reference in prose names a heading that exists where it says: ``see "X"``, ``section "X"``
  (this page), ``"X" below`` / ``"X" above`` (this page, after / before the reference),
  ``docs/x.md, "X"`` or ``x.md ("X")`` (that page), ``README "X"``, ``"X" in the README``,
  ``README section X`` and ``the README's X table`` (the README). "X" names a heading when it is
  the heading's text or the part before its ``:`` or `` (``;
- a markdown table starts with a header row and a separator row (``|---|``) with as many cells;
- CHANGELOG.rst is in bloom's format: an optional ``Forthcoming`` section on top, then one dated
  section per release (``0.2.0 (2026-11-27)``), the newest for package.xml's version.

Docs that drift from their own structure (a section renamed or moved to another page) fail here.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
CHANGELOG = ROOT / "CHANGELOG.rst"
DOCS = [README] + sorted((ROOT / "docs").glob("*.md"))
PAGES = DOCS + [CHANGELOG]

_FENCE = re.compile(r"^\s*(```|~~~)")
_ATX = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_RST_UNDERLINE = re.compile(r"^([=\-^~\"'`#*+])\1{2,}\s*$")


class Ref(NamedTuple):
    """One reference found in a page: what it names and where."""

    page: Path
    line: int
    kind: str                  # "link", "see", "below", "above", "file", "readme", "readme-words"
    target: Optional[Path]     # the page it points into (None: a file link without anchor check)
    name: str                  # heading text, anchor or link target as written

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


# ----- pages: prose, headings, anchors --------------------------------------------------------

def prose(text: str) -> str:
    """text with the lines of fenced code blocks blanked (line numbers kept)."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return "\n".join(out)


def _code_span(m: "re.Match[str]") -> str:
    """An inline code span in prose: a page path keeps its text (``docs/x.md`` names a page),
    anything else becomes a neutral word (quotes and brackets inside code are no references)."""
    body = m.group(2).strip()
    return body if re.fullmatch(r"[\w./-]+\.(md|rst)", body) else "CODE"


def without_code_spans(text: str) -> str:
    return re.sub(r"(`+)(.+?)\1", _code_span, text)


def heading_text(raw: str) -> str:
    """A heading as a reader sees it: links reduced to their text, code and emphasis marks gone."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    return re.sub(r"[`*]", "", text).strip()


def headings(page: Path) -> List[Tuple[int, str]]:
    """(line, text) of every heading of a markdown page (fenced code left out) or rst page."""
    lines = prose(page.read_text(encoding="utf-8")).splitlines()
    out: List[Tuple[int, str]] = []
    if page.suffix == ".rst":
        for i in range(1, len(lines)):
            title = lines[i - 1].strip()
            if title and _RST_UNDERLINE.match(lines[i]) and len(lines[i].strip()) >= len(title):
                out.append((i, title))
        return out
    for i, line in enumerate(lines, 1):
        m = _ATX.match(line)
        if m:
            out.append((i, heading_text(m.group(2))))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation but '-' and '_' removed, spaces -> '-'."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(page: Path) -> List[str]:
    """Every anchor GitHub gives page's headings (a repeated one gets -1, -2, ...)."""
    seen: Dict[str, int] = {}
    out = []
    for _, text in headings(page):
        s = slug(text)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.append(s if n == 0 else f"{s}-{n}")
    return out


def names_heading(name: str, heading: str) -> bool:
    """name is the heading's text, or the part before its ':' or ' (' (case and spacing aside)."""
    want = " ".join(name.split()).lower().rstrip(".")
    have = heading.lower()
    return have == want or have.startswith(want + ":") or have.startswith(want + " (")


# ----- references -----------------------------------------------------------------------------

_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_RST_LINK = re.compile(r"`[^`<]*<([^>`]+)>`__?")
_Q = r"\"(?P<name>[^\"\n]{2,80})\""
# a page named in prose: docs/x.md, x.md, ../README.md, or a markdown link to one
_PAGE = r"(?:\[[^\]]*\]\()?(?P<page>(?:\.\./)?(?:docs/)?[\w.-]+\.md)(?:#[\w-]*)?\)?"
_PATTERNS = [
    ("file", re.compile(_PAGE + r",?\s+\(?" + _Q)),
    ("readme", re.compile(r"\bREADME(?:'s)?(?:\s+section)?,?\s+\(?" + _Q)),
    ("readme", re.compile(_Q + r"\s+in\s+the\s+README\b")),
    ("readme", re.compile(r"\bREADME\s+section\s+(?P<name>[^\"\s][^\n,.;\"]*)")),
    ("readme-words", re.compile(r"\bREADME's\s+(?P<name>[a-z][\w /-]*?)\s+(?:table|section)\b")),
    ("below", re.compile(r"(?:\b[Ss]ee\s+|\bsection\s+)?" + _Q + r"\s+below\b")),
    ("above", re.compile(r"(?:\b[Ss]ee\s+|\bsection\s+)?" + _Q + r"\s+above\b")),
    ("see", re.compile(r"(?:\b[Ss]ee|\bsection)\s+" + _Q + r"(?!\s+(?:in|of)\s)")),
]


def _page_of(page: Path, name: str) -> Path:
    """The page a prose or link reference names, relative to the referring page (README-style
    'docs/x.md' from a page in docs/ means the same page)."""
    for base in (page.parent, ROOT):
        p = (base / name).resolve()
        if p.exists():
            return p
    return (page.parent / name).resolve()


def references(page: Path) -> Iterator[Ref]:
    """Every link and prose reference of page."""
    text = prose(page.read_text(encoding="utf-8"))
    if page.suffix == ".rst":
        text = re.sub(r"``([^`]+)``", lambda m: m.group(1) if re.fullmatch(r"[\w./-]+\.md", m.group(1))
                      else "CODE", text)
    else:
        text = without_code_spans(text)

    def line_of(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    for m in list(_LINK.finditer(text)) + list(_RST_LINK.finditer(text)):
        yield Ref(page, line_of(m.start()), "link", None, m.group(1))
    taken: List[Tuple[int, int]] = []
    for kind, rx in _PATTERNS:
        for m in rx.finditer(text):
            span = m.span("name")
            if any(a <= span[0] < b for a, b in taken):
                continue  # a longer form already took this name (docs/x.md, "X" below)
            taken.append(span)
            target = page
            if kind == "file":
                target = _page_of(page, m.group("page"))
            elif kind.startswith("readme"):
                target = README
            yield Ref(page, line_of(span[0]), kind, target, m.group("name").strip())


def problems(ref: Ref) -> List[str]:
    """What is wrong with one reference (empty when it resolves)."""
    if ref.kind == "link":
        return _link_problems(ref)
    assert ref.target is not None
    if not ref.target.exists():
        return [f"{ref.where()}: names a section of {ref.target.name}, which does not exist"]
    heads = headings(ref.target)
    if ref.kind == "readme-words":
        words = ref.name.lower()
        if any(words in h.lower() for _, h in heads):
            return []
        return [f"{ref.where()}: the README has no {ref.name!r} section (its headings: "
                f"{', '.join(h for _, h in heads[1:])})"]
    found = [line for line, h in heads if names_heading(ref.name, h)]
    where = "this page" if ref.target == ref.page else ref.target.relative_to(ROOT).as_posix()
    if not found:
        return [f"{ref.where()}: {ref.name!r} is no heading of {where}"]
    if ref.kind == "below" and not any(line > ref.line for line in found):
        return [f"{ref.where()}: {ref.name!r} is not below (line {found[0]})"]
    if ref.kind == "above" and not any(line < ref.line for line in found):
        return [f"{ref.where()}: {ref.name!r} is not above (line {found[0]})"]
    return []


def _link_problems(ref: Ref) -> List[str]:
    target = ref.name
    if re.match(r"^[a-z][\w+.-]*:", target) or target.startswith("//"):
        return []  # http:, https:, mailto:: not checked offline
    path_part, _, anchor = target.partition("#")
    page = (ref.page.parent / path_part).resolve() if path_part else ref.page
    if not page.exists():
        return [f"{ref.where()}: link to {target}: {path_part} does not exist"]
    if path_part and page == ref.page.resolve():
        return [f"{ref.where()}: link to {target}: the page links to itself"
                + ("" if anchor else " (drop the link or point it at a heading: #anchor)")]
    if anchor:
        if page.suffix != ".md":
            return [f"{ref.where()}: link to {target}: an anchor into {page.name}, not a markdown page"]
        if anchor not in anchors(page):
            return [f"{ref.where()}: link to {target}: {page.name} has no heading with anchor #{anchor}"]
    return []


# ----- tables ---------------------------------------------------------------------------------

_SEPARATOR_CELL = re.compile(r"^\s*:?-{3,}:?\s*$")


def cells(row: str) -> List[str]:
    """The cells of a table row ('|' inside code spans and '\\|' do not split)."""
    row = re.sub(r"(`+).+?\1", lambda m: m.group(0).replace("|", " "), row.replace("\\|", "  "))
    row = row.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|"):
        row = row[:-1]
    return row.split("|")


def table_problems(page: Path) -> List[str]:
    """Tables of a markdown page without a header and separator row, or with rows of another width."""
    out = []
    lines = prose(page.read_text(encoding="utf-8")).splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("|"):
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            i += 1
        rows = lines[start:i]
        where = f"{page.relative_to(ROOT)}:{start + 1}"
        if len(rows) < 2 or not all(_SEPARATOR_CELL.match(c) for c in cells(rows[1])):
            out.append(f"{where}: table without a header row and a separator row (|---|) under it")
            continue
        width = len(cells(rows[0]))
        for n, row in enumerate(rows[1:], start + 2):
            if len(cells(row)) != width:
                out.append(f"{page.relative_to(ROOT)}:{n}: {len(cells(row))} cells, the header has {width}")
    return out


# ----- the tests ------------------------------------------------------------------------------

REFS = [r for p in PAGES for r in references(p)]


def test_the_docs_have_references():
    kinds: Dict[str, int] = {}
    for r in REFS:
        kinds[r.kind] = kinds.get(r.kind, 0) + 1
    assert kinds.get("link", 0) > 50 and kinds.get("file", 0) >= 5 and kinds.get("see", 0) >= 2, kinds


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_and_references_resolve(page: Path):
    found = [p for r in REFS if r.page == page for p in problems(r)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("page", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_tables_have_a_header(page: Path):
    found = table_problems(page)
    assert not found, "\n".join(found)


def changelog_sections(text: str) -> List[str]:
    """Titles of CHANGELOG.rst's sections (underlined with '-'), top to bottom."""
    lines = text.splitlines()
    return [lines[i - 1].strip() for i in range(1, len(lines))
            if re.fullmatch(r"-{3,}", lines[i].strip()) and lines[i - 1].strip()
            and len(lines[i].strip()) >= len(lines[i - 1].strip())]


def test_changelog_has_a_dated_section_for_the_version():
    version = re.search(r"<version>([^<]+)</version>", (ROOT / "package.xml").read_text()).group(1)
    titles = changelog_sections(CHANGELOG.read_text(encoding="utf-8"))
    releases = [t for t in titles if t != "Forthcoming"]
    assert titles and titles[0] in ("Forthcoming", releases[0]) and titles.count("Forthcoming") <= 1, titles
    bad = [t for t in releases if not re.fullmatch(r"\d+\.\d+\.\d+ \(\d{4}-\d{2}-\d{2}\)", t)]
    assert not bad, f"CHANGELOG.rst: {bad} are neither 'Forthcoming' nor 'X.Y.Z (YYYY-MM-DD)' (bloom skips them)"
    assert releases[0].split()[0] == version, \
        f"the newest CHANGELOG.rst section is {releases[0]}, package.xml says {version}"


def test_slug_follows_github():
    assert slug("A fleet's cameras through one relayed uplink (bench_fleet)") == \
        "a-fleets-cameras-through-one-relayed-uplink-bench_fleet"
    assert slug("Camera: raw vs link-aware") == "camera-raw-vs-link-aware"
    assert slug("One camera over DERP with H.264 (one run, 2026-11-27 12:55)") == \
        "one-camera-over-derp-with-h264-one-run-2026-11-27-1255"
    assert heading_text("Code layout (`overlay_manager/dashboard/`)") == "Code layout (overlay_manager/dashboard/)"


def test_the_checks_catch_what_they_are_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "README.md").write_text("# R\n\n## Five minutes\n\ntext\n")
    page = docs / "a.md"
    page.write_text(
        "# A\n\n## Private CA: a section\n\n```bash\n## not a heading\n```\n\n"
        "[ok](#private-ca-a-section) [bad](#not-a-heading) [self](a.md) [gone](b.md) [ok](../README.md#five-minutes)\n"
        'see "Private CA" and see "Nowhere"; "Private CA" above; "Private CA" below.\n'
        'README "Five minutes", README "Starting machines", the README\'s troubleshooting table,\n'
        '../README.md, "Five minutes"; `see "in code"`.\n\n'
        "| a | b |\n|---|---|\n| 1 | 2 |\n\ntext\n\n| 1 | 2 |\n| 3 | 4 |\n")
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "README", tmp_path / "README.md")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    found = [p for r in references(page) for p in problems(r)]
    tables = table_problems(page)
    text = "\n".join(found)
    assert "#not-a-heading" in text and "links to itself" in text and "b.md does not exist" in text
    assert "'Nowhere' is no heading" in text and "'Private CA' is not below" in text
    assert "'Starting machines' is no heading of README.md" in text and "no 'troubleshooting' section" in text
    assert "in code" not in text and "five-minutes" not in text and "'Five minutes'" not in text
    assert len(found) == 7, text
    assert len(tables) == 1 and "docs/a.md:20" in tables[0], tables
