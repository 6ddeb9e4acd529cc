"""The front door cannot rot: the README's shape, every relative link of README.md and docs/ resolving
(file and anchor), and the README's client snippet run as written against the CPU demo.

The docs site itself is built by ``mkdocs build --strict`` in scripts/lint.sh; README.md sits outside the
site, so its links are checked here (docs/ too, with the anchors mkdocs would make)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

from tests.support.moshi_client import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code, where links are links."""
    return re.sub(r"`[^`\n]*`", "", _FENCE.sub("", text))


def _anchors(path: Path) -> set[str]:
    """The heading ids mkdocs' toc extension gives ``path`` (duplicates get _1, _2, as it does)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in _FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        title = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", m.group(1))
        slug = slugify(title, "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}_{n}")
    return out


def _broken_links(path: Path, root: Path = ROOT) -> list[str]:
    broken: list[str] = []
    for m in _LINK.finditer(_prose(path.read_text())):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{path.relative_to(root)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{path.relative_to(root)}: {target} (no such heading in {dest.name})")
    return broken


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert _broken_links(path) == []


def test_the_link_check_finds_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title\n\n## Part one\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#part-one) [gone](missing.md) [bad](a.md#part-two) `[code](x.md)`\n")
    found = [b.split(": ", 1)[1] for b in _broken_links(page, tmp_path)]
    assert found == ["missing.md (no such file)", "a.md#part-two (no such heading in a.md)"]


def test_readme_reads_in_five_minutes() -> None:
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 200
    head = "\n".join(lines[:60])
    assert "./scripts/serve.sh" in head and "./scripts/test.sh" in head
    assert "```mermaid" in text
    assert "(client/" not in text and "client/ holds the browser" not in text  # the page lives in server/static


def _snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 1, "the README has one Python block: the client snippet"
    return blocks[0]


def test_readme_client_snippet_runs_as_written(demo_server: ServerProcess, tmp_path: Path) -> None:
    """The README's own shell line makes ``question.wav``; the snippet runs unchanged but for the port of the
    suite's shared CPU demo (the README's ``127.0.0.1:8998`` is a developer's server, not the suite's)."""
    code = _snippet()
    assert len(code.splitlines()) <= 15
    readme_url = "http://127.0.0.1:8998/v1"
    assert code.count(readme_url) == 1
    make_wav = re.search(r"`(espeak-ng -w q\.wav [^`]*)`", README.read_text())
    assert make_wav, "the README says how to make question.wav"
    subprocess.run(make_wav.group(1), shell=True, cwd=tmp_path, check=True, timeout=60)
    (tmp_path / "snippet.py").write_text(code.replace(readme_url, f"{demo_server.http_url}/v1"))
    done = subprocess.run(
        [sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = done.stdout.strip()
    assert said.startswith("kame said:") and len(said) > len("kame said:") + 1, said
