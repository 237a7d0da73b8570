"""Every Python block in docs/ runs as written (STYLE R43), offline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / "docs").rglob("*.md")):
        for index, match in enumerate(BLOCK.finditer(path.read_text())):
            found.append((f"{path.relative_to(ROOT)}#{index + 1}", match.group(1)))
    return found


@pytest.mark.parametrize(("where", "code"), _blocks(), ids=[w for w, _ in _blocks()])
def test_docs_code_block_runs(where: str, code: str, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNKIT_")}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert done.returncode == 0, f"{where} failed:\n{done.stderr[-2000:]}"


LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^(```|~~~)")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines of a page outside its code blocks, numbered from 1."""
    lines: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


def _anchors(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings (`## Who may call` → `who-may-call`)."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    for _, line in _prose_lines(text):
        heading = HEADING.match(line)
        if heading is None:
            continue
        words = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(2)).strip().lower()
        slug = re.sub(r"[^\w\- ]", "", words).replace(" ", "-")
        seen = counts.get(slug, 0)
        found.add(slug if seen == 0 else f"{slug}-{seen}")
        counts[slug] = seen + 1
    return found


def test_every_link_between_docs_pages_resolves() -> None:
    """A relative link names a file that exists, and its `#anchor` a heading of that page."""
    pages = sorted((ROOT / "docs").rglob("*.md"))
    broken: list[str] = []
    for page in pages:
        for number, line in _prose_lines(page.read_text()):
            for link in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", link):  # https:, mailto:
                    continue
                path, _, anchor = link.partition("#")
                target = (page.parent / path).resolve() if path else page.resolve()
                where = f"{page.relative_to(ROOT)}:{number}: {link}"
                if not target.exists():
                    broken.append(f"{where} (no such file)")
                elif (
                    anchor and target.suffix == ".md" and anchor not in _anchors(target.read_text())
                ):
                    broken.append(f"{where} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)
