"""The documentation holds together: README.md and the MkDocs site under docs/.

- every relative link (and image) in README.md and docs/*.md names a file that exists, and an anchor that
  one of its headings gives; links from docs/ stay inside docs/ (MkDocs cannot serve anything else);
- README.md stays a short entry point (at most 200 lines);
- every page in docs/ is in mkdocs.yml's nav, and the nav names no missing page;
- `mkdocs build --strict` passes, when mkdocs and its Material theme are installed (the `docs` extra).

No database or service is needed; the whole module runs in a few seconds.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MKDOCS_YML = ROOT / "mkdocs.yml"
MAX_README_LINES = 200

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _documents() -> list[Path]:
    return [README, *_pages()]


def _without_code(text: str) -> str:
    """The text with fenced blocks and code spans blanked: a link inside code is an example, not a link."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (MkDocs) gives a heading: its text, markup removed, slugified."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with the `_1`, `_2` suffixes of repeated headings."""
    seen: dict[str, int] = {}
    anchors = set()
    for match in _HEADING.finditer(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        slug = _slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}_{count}")
    return anchors


def _relative_links(path: Path) -> list[str]:
    links = _LINK.findall(_without_code(path.read_text(encoding="utf-8")))
    return [link for link in links if not _SCHEME.match(link) and not link.startswith("//")]


def _nav_pages(nav) -> list[str]:
    """The page paths a mkdocs.yml nav names, at any depth."""
    if isinstance(nav, str):
        return [] if _SCHEME.match(nav) else [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def _mkdocs_config() -> dict:
    return yaml.safe_load(MKDOCS_YML.read_text(encoding="utf-8"))


def test_the_documents_exist():
    assert README.is_file()
    assert MKDOCS_YML.is_file()
    assert _pages(), "docs/ holds no page"


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document: Path):
    problems = []
    for link in _relative_links(document):
        target, _, anchor = link.partition("#")
        path = (document.parent / target).resolve() if target else document
        if document.is_relative_to(DOCS) and not path.is_relative_to(DOCS):
            problems.append(f"{link}: outside docs/ (MkDocs cannot serve it; write the path as code instead)")
        elif not path.exists():
            problems.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            problems.append(f"{link}: {path.name} has no heading with the anchor #{anchor}")
    assert not problems, f"{document.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines; move detail to docs/ (at most {MAX_README_LINES})"
    )


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = _mkdocs_config()
    docs_dir = ROOT / config.get("docs_dir", "docs")
    named = _nav_pages(config.get("nav", []))
    pages = {p.relative_to(docs_dir).as_posix() for p in _pages()}
    assert sorted(pages - set(named)) == [], "pages missing from mkdocs.yml's nav"
    assert sorted(set(named) - pages) == [], "nav entries naming no page"
    assert len(named) == len(set(named)), "a page appears twice in the nav"


def test_mkdocs_is_strict_and_builds_where_git_ignores():
    config = _mkdocs_config()
    assert config.get("strict") is True
    site_dir = config.get("site_dir", "site").rstrip("/")
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert f"{site_dir}/" in ignored or site_dir in ignored, f"{site_dir}/ is not in .gitignore"


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
    reason="mkdocs and mkdocs-material are not installed (pip install -e '.[docs]')",
)
def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--quiet",
            "--config-file",
            str(MKDOCS_YML),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()
