"""The docs: README.md stays a first page (at most 200 lines, every relative link resolving to
a file), and the site that mkdocs.yml builds from docs/ builds with ``--strict``, so a link
between pages to a missing page or heading fails here rather than on a reader."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 200
# [text](target) and [text](target "title"); images too. Code spans and fenced blocks are
# dropped first, so a command's brackets are not read as links.
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def relative_links(markdown: str) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", t)]


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file (the part before any ``#``) does not exist."""
    broken = []
    for target in relative_links(page.read_text()):
        path = target.split("#", 1)[0]
        if path and not (page.parent / path).exists():
            broken.append(target)
    return broken


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=config.parent,
    )


def test_readme_is_a_first_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move detail to docs/"
    )


def test_every_relative_link_in_the_readme_resolves():
    links = relative_links(README.read_text())
    assert any(t.startswith("docs/guides/") for t in links)  # the guides are linked from it
    assert broken_links(README) == []


def test_link_finder_reads_links_and_skips_code(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# There\n")
    page.write_text(
        "[ok](there.md#x) [gone](missing.md) [web](https://example.org) [here](#top)\n"
        "`[not](a-link.md)`\n```\n[nor](this.md)\n```\n"
    )
    assert relative_links(page.read_text()) == ["there.md#x", "missing.md"]
    assert broken_links(page) == ["missing.md"]


def test_the_docs_site_builds_strictly(tmp_path):
    res = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert res.returncode == 0, res.stdout + res.stderr
    for page in (
        "index.html",
        "guides/inference.html",
        "guides/validator.html",
        "guides/trainer.html",
        "benchmarks.html",
        "testing.html",
    ):
        assert (tmp_path / "site" / page).is_file(), page


def test_a_broken_link_or_heading_fails_the_build(tmp_path):
    """The same configuration over a copy of docs/ with one page linking to a page that does
    not exist, then to a heading that does not exist: each fails the strict build."""
    config = (ROOT / "mkdocs.yml").read_text()
    for bad, says in (
        ("[gone](guides/no-such-page.md)", "no-such-page.md"),
        ("[gone](ledger.md#no-such-heading)", "no-such-heading"),
    ):
        work = tmp_path / says
        docs = work / "docs"
        shutil.copytree(ROOT / "docs", docs)
        (work / "mkdocs.yml").write_text(config)
        index = docs / "index.md"
        index.write_text(index.read_text() + f"\n{bad}\n")
        res = mkdocs_build(work / "mkdocs.yml", work / "site")
        assert res.returncode != 0, bad
        assert says in res.stdout + res.stderr
