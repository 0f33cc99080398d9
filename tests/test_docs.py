"""The docs: README.md stays a first page (at most 200 lines, every relative link resolving to
a file), and the site that mkdocs.yml builds from docs/ (and the root SPEC.md) builds with
``--strict``, so a link between pages to a missing page or heading fails here rather than on
a reader. The spec is three files with one numbering (SPEC §N): the sections run 1, 2, … with
no gap across them, subsections N.1, N.2, …, and each file's contents list its headings."""

import contextlib
import importlib.util
import io
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# The spec, in the order its numbering runs through it.
SPEC_FILES = ("SPEC.md", "docs/spec/economics.md", "docs/spec/training.md")
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


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading (``scripts/mkdocs_hooks.py`` gives the site the same)."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return text.replace(" ", "-")


NUMBERED = re.compile(r"^(##|###) (\d+)(?:\.(\d+))?\.? ")
TOC_ENTRY = re.compile(r"^(\s*)- \[(.*)\]\(([^)]*)\)$")


def spec_headings(markdown: str) -> list[tuple[str, str]]:
    """The (level, text) of each ``##`` and ``###`` heading outside code blocks."""
    text = FENCE.sub("", markdown)
    return [(m[1], m[2]) for m in re.finditer(r"^(##|###) (.*)$", text, re.M)]


def spec_contents(markdown: str) -> list[tuple[str, str]]:
    """The (text, link) entries of the ``## Contents`` list, in order."""
    part = markdown.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    return [(m[2], m[3]) for line in part.splitlines() if (m := TOC_ENTRY.match(line))]


def numbering_problems(files: dict[str, str]) -> tuple[list[str], dict[str, list[str]]]:
    """What breaks the one numbering that runs through ``files`` (name -> text, in order):
    sections ``## N. Title`` 1, 2, … with no gap, subsections ``### N.M Title`` N.1, N.2, …
    under N. Also each file's numbered headings, in order."""
    problems: list[str] = []
    numbered: dict[str, list[str]] = {}
    top_next, sub = 0, 0
    for name, text in files.items():
        numbered[name] = []
        for level, heading in spec_headings(text):
            m = NUMBERED.match(f"{level} {heading}")
            if m is None:
                if level == "##" and heading != "Contents":
                    problems.append(f"{name}: section without a number: {heading}")
                continue
            numbered[name].append(heading)
            top, minor = int(m[2]), m[3]
            if level == "##" and minor is None:
                top_next, sub = top_next + 1, 0
                if top != top_next:
                    problems.append(f"{name}: section {top} where {top_next} comes next")
                    top_next = top
            elif level == "###" and minor is not None:
                sub += 1
                if (top, int(minor)) != (top_next, sub):
                    problems.append(
                        f"{name}: subsection {top}.{minor} where {top_next}.{sub} comes next"
                    )
            else:
                problems.append(f"{name}: {level} {heading}: level and number disagree")
    return problems, numbered


def contents_problems(files: dict[str, str], numbered: dict[str, list[str]]) -> list[str]:
    """Every file's ``## Contents`` lists its numbered headings in order, each linked to its
    GitHub anchor; the first file's lists every file's (another file's by its path relative
    to the first)."""
    problems = []
    first = next(iter(files))
    for name, text in files.items():
        if "\n## Contents\n" not in text:
            problems.append(f"{name}: no ## Contents")
            continue
        want = []
        for other in files if name == first else [name]:
            prefix = "" if other == name else str(Path(other).relative_to(Path(name).parent))
            want += [(h, f"{prefix}#{github_slug(h)}") for h in numbered[other]]
        got = [(entry, link) for entry, link in spec_contents(text) if "#" in link]
        if got != want:
            missing = [w for w in want if w not in got]
            extra = [g for g in got if g not in want]
            problems.append(
                f"{name}: contents do not match the headings (missing or changed: {missing}; "
                f"extra: {extra}; or out of order)"
            )
    return problems


def spec_problems(files: dict[str, str]) -> list[str]:
    """What breaks the spec's numbering or its contents; ``files``: name -> text, in order."""
    problems, numbered = numbering_problems(files)
    return problems + contents_problems(files, numbered)


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


BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
COMMAND = re.compile(r"^\s*(\S*/)?intellect-node(\s|$)")
OPTIONAL = re.compile(r"\[[^\[\]]*\]")  # a synopsis's [--flag VALUE] group


def command_lines(markdown: str) -> list[list[str]]:
    """The arguments of each ``intellect-node ...`` command in ``markdown``'s code blocks:
    continuation lines joined, comments and a synopsis's ``[optional]`` groups and ``...``
    dropped, ``a|b`` read as ``a``; each command of a line joined by ``&&``, ``;`` or a
    pipe."""
    commands = []
    for block in BLOCK.findall(markdown):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"(^|\s)#.*", "", line)
            while OPTIONAL.search(line):
                line = OPTIONAL.sub("", line)
            for part in re.split(r"&&|\|\||;| \| ", line):
                if COMMAND.match(part):
                    words = [w.split("|")[0] for w in shlex.split(part) if w != "..."]
                    commands.append(words[1:])
    return commands


def test_the_command_finder_reads_continuations_synopses_and_chains():
    page = (
        "```bash\nintellect-node start --role trainer \\\n    --name t   # the trainer\n"
        "cd x && .venv/bin/intellect-node keys new|show [--force] ...\n```\n"
        "`intellect-node not-in-a-block`\n"
    )
    assert command_lines(page) == [["start", "--role", "trainer", "--name", "t"], ["keys", "new"]]


@pytest.mark.parametrize(
    "page", [README, *sorted((ROOT / "docs").rglob("*.md"))], ids=lambda p: p.name
)
def test_every_command_line_in_the_docs_parses(page):
    """Each ``intellect-node ...`` line a reader may copy parses with the real parser (flags
    that exist, values of their type and choices), without running it: a renamed or
    removed flag left in a page fails here, and so does an old flat one (``--async-level``,
    which ``start`` refuses with its new place)."""
    from node.cli.flags import OLD
    from node.cli.main import build_parser

    wrong = []
    for argv in command_lines(page.read_text()):
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                args = build_parser().parse_args(argv)
            moved = [k for k, v in vars(args).items() if k.startswith(OLD) and v]
            if moved:  # an old flat flag parses only to be refused with its new place
                wrong.append(f"intellect-node {shlex.join(argv)}: old flag {moved}")
        except SystemExit as exc:
            if exc.code:
                wrong.append(
                    f"intellect-node {shlex.join(argv)}: {said.getvalue().splitlines()[-1]}"
                )
    assert wrong == []


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
        "spec/SPEC.html",
        "spec/economics.html",
        "spec/training.html",
    ):
        assert (tmp_path / "site" / page).is_file(), page
    # a link into another spec file lands on the heading's anchor in the site
    spec = (tmp_path / "site" / "spec" / "SPEC.html").read_text()
    assert 'href="economics.html#19-ledger-' in spec
    assert 'id="19-ledger-' in (tmp_path / "site" / "spec" / "economics.html").read_text()


def test_the_spec_is_numbered_on_through_its_three_files_with_contents():
    files = {name: (ROOT / name).read_text() for name in SPEC_FILES}
    assert spec_problems(files) == []
    tops = [h for text in files.values() for lvl, h in spec_headings(text) if lvl == "##"]
    assert sum(NUMBERED.match(f"## {h}") is not None for h in tops) >= 20


def test_a_gap_in_the_numbering_or_a_stale_contents_entry_is_found():
    files = {name: (ROOT / name).read_text() for name in SPEC_FILES}
    eco = files["docs/spec/economics.md"]
    skipped = dict(files)  # §19 renumbered §20: a gap, and contents that no longer match
    skipped["docs/spec/economics.md"] = eco.replace("\n## 19. ", "\n## 20. ")
    problems = spec_problems(skipped)
    assert any("section 20 where 19 comes next" in p for p in problems), problems
    assert any(p.startswith("SPEC.md: contents") for p in problems), problems
    assert any(p.startswith("docs/spec/economics.md: contents") for p in problems), problems
    sub = dict(files)  # a subsection out of order
    sub["docs/spec/economics.md"] = eco.replace("\n### 18.2 ", "\n### 18.3 ")
    assert any("subsection 18.3 where 18.2" in p for p in spec_problems(sub))


def renumbering_script():
    path = ROOT / "scripts" / "spec_renumber.py"
    spec = importlib.util.spec_from_file_location("spec_renumber", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_the_old_numbers_map_to_sections_that_exist_where_the_script_says():
    """scripts/spec_renumber.py (the old one-file numbering to the split spec's): every new
    number is a heading of the file the script places it in."""
    script = renumbering_script()
    where = {}
    for name in SPEC_FILES:
        for level, heading in spec_headings((ROOT / name).read_text()):
            if m := NUMBERED.match(f"{level} {heading}"):
                where[m[2] + (f".{m[3]}" if m[3] else "")] = name
    for old, new in script.OLD_TO_NEW.items():
        assert where.get(new) == script.spec_file(new), (old, new)
    for new, _ in script.SPLIT.values():
        assert new in where
    # 18: old §14's other half; 19.2: new since the split
    assert set(where) <= set(script.OLD_TO_NEW.values()) | {"18", "19.2"}


def test_the_renumbering_script_rewrites_each_form_once():
    script = renumbering_script()
    text = (
        "SPEC §12.1 and SPEC.md §12, SPEC.md section 15, SPEC\n    # section 17.1, §19–20, "
        "§§11.1-11.2, §5; a validator recomputes (SPEC §14); served (SPEC §14); §18 unknown"
    )
    new, changes = script.rewrite(text)
    assert new == (
        "SPEC §19.1 and SPEC §19, SPEC.md section 14, SPEC\n    # section 21, §16–17, "
        "§§18.1-18.2, §5; a validator recomputes (SPEC §18); served (SPEC §13); §18 unknown"
    )
    assert len(changes) == 8
    assert (
        script.rewrite("section 12 (the ledger)", bare_sections=True)[0]
        == "section 19 (the ledger)"
    )
    assert script.rewrite("section 12 (the ledger)")[0] == "section 12 (the ledger)"


def test_a_broken_link_or_heading_fails_the_build(tmp_path):
    """The same configuration over a copy of docs/ (with SPEC.md and the hooks) with one page
    linking to a page that does not exist, then to a heading that does not exist, then to a
    heading of the spec that does not exist, and SPEC.md linking to one in another spec file:
    each fails the strict build."""
    config = (ROOT / "mkdocs.yml").read_text()
    for page, bad, says in (
        ("docs/index.md", "[gone](guides/no-such-page.md)", "no-such-page.md"),
        ("docs/index.md", "[gone](ledger.md#no-such-heading)", "no-such-heading"),
        ("docs/index.md", "[gone](../SPEC.md#99-no-such-section)", "99-no-such-section"),
        ("SPEC.md", "[gone](docs/spec/training.md#98-no-such-section)", "98-no-such-section"),
    ):
        work = tmp_path / says
        shutil.copytree(ROOT / "docs", work / "docs")
        (work / "scripts").mkdir()
        shutil.copy(ROOT / "scripts" / "mkdocs_hooks.py", work / "scripts")
        shutil.copy(ROOT / "SPEC.md", work / "SPEC.md")
        (work / "mkdocs.yml").write_text(config)
        index = work / page
        index.write_text(index.read_text() + f"\n{bad}\n")
        res = mkdocs_build(work / "mkdocs.yml", work / "site")
        assert res.returncode != 0, bad
        assert says in res.stdout + res.stderr


def test_ci_runs_the_readme_test_command_and_it_runs_both_tiers():
    """README's second command is what `.ci/run` runs, and scripts/test.sh runs the quick
    tier and then the slow one (every test but the GPU tier)."""
    block = README.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    assert len(commands) == 2 and commands[1].startswith("./scripts/setup.sh && ")
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert ci[-1].strip() == commands[1]
    runs = [
        line.split("pytest", 1)[1].split()
        for line in (ROOT / "scripts" / "test.sh").read_text().splitlines()
        if line.startswith(".venv/bin/python -m pytest")
    ]
    assert len(runs) == 2
    quick, slow = runs
    assert "-m" not in quick  # pyproject's addopts: not slow and not gpu
    assert slow[slow.index("-m") + 1] == "slow"
    assert '-m \\"not slow and not gpu\\"' in (ROOT / "pyproject.toml").read_text()


# "SPEC §15", "SPEC section 18.1", "SPEC.md §3", "SPEC §§11–12" (the first of a range)
SPEC_REFERENCE = re.compile(r"SPEC(?:\.md)?\s+(?:§§?|section\s+)(\d+(?:\.\d+)?)")


def dangling_spec_references(texts: dict[str, str], sections: set[str]) -> list[str]:
    """Each ``SPEC §N`` in ``texts`` (name -> text) that names no section of ``sections``."""
    return [
        f"{name}: SPEC §{m[1]}"
        for name, text in texts.items()
        for m in SPEC_REFERENCE.finditer(text)
        if m[1] not in sections
    ]


def spec_sections() -> set[str]:
    """The numbers of the spec's sections and subsections: "15", "18.1", ..."""
    _, numbered = numbering_problems({f: (ROOT / f).read_text() for f in SPEC_FILES})
    sections = set()
    for heading in (h for headings in numbered.values() for h in headings):
        m = NUMBERED.match(f"## {heading}")
        sections.add(m[2] if m[3] is None else f"{m[2]}.{m[3]}")
    return sections


def test_every_spec_reference_in_the_house_names_a_section_that_exists():
    """The spec was renumbered once (split in three files): a reference left with its old
    number, or one to a section that went, is found here."""
    sections = spec_sections()
    assert {"1", "18.1", "22"} <= sections
    listed = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.vy", "*.yml", "*.toml", "*.html", "*.js", "*.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    texts = {f: (ROOT / f).read_text() for f in listed if (ROOT / f).is_file()}
    texts.pop("scripts/spec_renumber.py", None)  # its table holds the old numbers
    texts.pop("tests/test_docs.py", None)
    assert dangling_spec_references(texts, sections) == []
    # and the check finds one
    assert dangling_spec_references({"x.py": "see SPEC §23 and SPEC section 18.9"}, sections) == [
        "x.py: SPEC §23",
        "x.py: SPEC §18.9",
    ]
