"""mkdocs hooks (mkdocs.yml ``hooks:``): the root SPEC.md in the docs site, and links and
anchors that work both on the site and in the repository.

The spec is three files (SPEC §N numbers one section across them): SPEC.md at the
repository's root, outside ``docs_dir``, and docs/spec/economics.md and
docs/spec/training.md inside it. SPEC.md joins the site as ``spec/SPEC.md`` (beside the other
two). Every page's links are written for the repository (``docs/spec/economics.md#…`` from
SPEC.md, ``../../SPEC.md#…`` from docs/spec/); each link that resolves, from the page's file in
the repository, to a file of the site is rewritten to that file's place in the site, so the
strict build checks the same links and anchors a reader follows on GitHub. Headings get
GitHub's anchors (``github_slug``), so ``#19-ledger-…`` names the same heading in both.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
SPEC_IN_SITE = "spec/SPEC.md"
LINK = re.compile(r"(\]\(\s*<?)([^)\s>#]+\.md)(#[^)\s>]*)?")


def github_slug(value: str, separator: str = "-") -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", value.strip().lower())
    return text.replace(" ", separator)


def on_config(config: Any) -> Any:
    config.mdx_configs.setdefault("toc", {})["slugify"] = github_slug
    if "toc" not in config.markdown_extensions:
        config.markdown_extensions.append("toc")
    return config


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, SPEC_IN_SITE, abs_src_path=str(ROOT / "SPEC.md")))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    """Each link that resolves from the page's file in the repository to a page of the site,
    rewritten to where that page is in the site."""
    by_path = {os.path.normpath(f.abs_src_path): f for f in files if f.abs_src_path}
    here = Path(page.file.abs_src_path).parent
    site_dir = Path(page.file.src_uri).parent

    def rewrite(m: re.Match[str]) -> str:
        target = by_path.get(os.path.normpath(here / m[2]))
        if target is None:
            return m[0]
        rel = os.path.relpath(target.src_uri, site_dir).replace(os.sep, "/")
        return m[1] + rel + (m[3] or "")

    return LINK.sub(rewrite, markdown)
