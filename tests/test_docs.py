"""The pages hold together: the README keeps to its four jobs and points at
every page in docs/, every relative link in the project's Markdown reaches a
file (and a heading, when it names one), and each tool package's docstring
names every module in it. Reads files only: no process, no network."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def markdown_files() -> list[Path]:
    return sorted(path for path in REPO.rglob("*.md")
                  if not any(part.startswith(".") or part in ("__pycache__", "node_modules")
                             for part in path.relative_to(REPO).parts))


def anchors(page: Path) -> set[str]:
    """The ids GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens,
    a repeated heading numbered."""
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_every_relative_link_reaches_its_file_and_heading():
    broken = []
    for page in markdown_files():
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not ours to check here
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)} -> {target}"
            if not file.exists():
                broken.append(f"{where}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{where}: no heading with that id in {file.relative_to(REPO)}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_keeps_to_what_it_is_the_two_commands_the_demo_and_where_to_go():
    readme = (REPO / "README.md").read_text()
    headings = re.findall(r"^## (.*)$", readme, re.M)
    assert headings == ["The two commands", "What the demo shows", "Where to go next"], (
        f"README.md is what this is, the two commands, the demo transcript and where to go next; the rest "
        f"belongs on a page in docs/ (its headings now: {headings})")
    assert "make demo" in readme and "make test" in readme and "<!-- demo-transcript -->" in readme
    nxt = readme[readme.index("## Where to go next"):]
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)[)#]", nxt))
    pages = {f"docs/{page.name}" for page in (REPO / "docs").glob("*.md")}
    assert pages <= linked, f"README.md's 'Where to go next' has no line for {sorted(pages - linked)}"
    for target in ("(LAB.md)", "(exercises/README.md)"):
        assert target in nxt, target


def test_the_lab_package_names_every_module_in_its_docstring():
    """lab/__init__.py is the table of contents of lab/, as lesson/__init__.py is of lesson/."""
    package = REPO / "lab"
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    modules = {path.stem for path in package.glob("*.py") if path.stem != "__init__"}
    named = set(re.findall(r"``lab\.(\w+)``", doc))
    assert modules <= named, f"lab/__init__.py does not say what {sorted(modules - named)} is for"
    assert named <= modules, f"lab/__init__.py names {sorted(named - modules)}, which lab/ does not have"
