"""A TODO says what must hold and why, never the code (CONVENTIONS.md, "Exercises a learner does"): the
answer lives in the solution and the how in the README's folded hints, so a learner cannot pass by
transcribing comments.

Held here for every exercise, present and future: no stretch of 20 characters of a line the solution adds
(whitespace-normalised, holding at least one character that is not a letter, digit or underscore, so a name
the contract gives, such as an environment variable, may still be named) appears in a TODO comment of the
practice beside it.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

EXERCISES = Path(__file__).resolve().parents[1] / "exercises"
TODO = re.compile(r"^\s*# TODO (\d+) \(exercise (\d+)\):")
END = re.compile(r"^\s*# END TODO (\d+)\b")
WINDOW = 20


def normalised(text: str) -> str:
    return " ".join(text.split())


def todo_comments(path: Path) -> dict[int, str]:
    """Each TODO's comment text, markers and ``#`` removed, whitespace-normalised; a TODO of several blocks
    (TODO 1: what a COMMIT promises, in open_record, and the run's row, in start) is read whole."""
    comments: dict[int, str] = {}
    number: int | None = None
    for line in path.read_text().splitlines():
        if (start := TODO.match(line)) is not None:
            number = int(start.group(1))
            comments[number] = (comments.get(number, "") + " " + line.split(":", 1)[1]).strip()
            continue
        if END.match(line):
            number = None
            continue
        if number is not None and line.strip().startswith("#"):
            comments[number] += " " + line.strip().lstrip("#")
    return {n: normalised(text) for n, text in comments.items()}


def code_only(path: Path) -> list[str]:
    """The file's lines with comments and docstrings blanked: the code a TODO could dictate."""
    source = path.read_text()
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            for i in range(body[0].lineno - 1, body[0].end_lineno or body[0].lineno):
                lines[i] = ""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    return [normalised(line) for line in lines]


def added_lines(solution: Path, practice: Path) -> list[str]:
    """The solution's lines of code the practice does not have (whitespace-normalised)."""
    theirs = set(code_only(practice))
    return [code for code in code_only(solution) if code and code not in theirs]


def dictated(line: str, comment: str) -> str | None:
    """A stretch of ``line`` the comment spells out, or None."""
    for i in range(len(line) - WINDOW + 1):
        stretch = line[i:i + WINDOW]
        if re.fullmatch(r"[\w ]+", stretch) is None and stretch in comment:
            return stretch
    return None


PAIRS = sorted((practice, practice.parent.parent / "solution" / practice.name)
               for practice in EXERCISES.glob("*/practice/*.py"))


def test_every_exercise_with_todos_is_covered():
    with_todos = {p.parent.parent.name for p, _ in PAIRS if todo_comments(p)}
    assert len(with_todos) >= 6, with_todos


@pytest.mark.parametrize("practice,solution", PAIRS, ids=[f"{p.parent.parent.name}/{p.name}" for p, _ in PAIRS])
def test_no_todo_spells_out_its_answer(practice: Path, solution: Path):
    comments = todo_comments(practice)
    if not comments:
        pytest.skip("no TODO in this file")
    assert solution.exists(), f"{practice} has TODOs but no solution beside it"
    found = []
    for line in added_lines(solution, practice):
        for number, comment in comments.items():
            if (stretch := dictated(line, comment)) is not None:
                found.append(f"TODO {number} spells {stretch!r} of the solution's line {line[:100]!r}")
    assert not found, "\n".join(found)


def test_the_check_catches_a_todo_that_dictates(tmp_path):
    """The rule can fail: a TODO quoting its solution's call is caught."""
    (tmp_path / "practice").mkdir()
    (tmp_path / "solution").mkdir()
    (tmp_path / "practice" / "flow.py").write_text(
        "def f():\n    # TODO 1 (exercise 1): call `await run_steps(conn, inputs, start_at=current)`\n"
        "    # END TODO 1\n    pass\n")
    (tmp_path / "solution" / "flow.py").write_text(
        "def f():\n    await run_steps(conn, inputs, start_at=current)\n    pass\n")
    practice, solution = tmp_path / "practice" / "flow.py", tmp_path / "solution" / "flow.py"
    lines = added_lines(solution, practice)
    assert lines == ["await run_steps(conn, inputs, start_at=current)"]
    assert dictated(lines[0], todo_comments(practice)[1]) is not None


def test_every_block_of_a_todo_is_read(tmp_path):
    """A TODO of two blocks: the second block's comment is checked as the first one's is."""
    (tmp_path / "practice").mkdir()
    (tmp_path / "solution").mkdir()
    (tmp_path / "practice" / "flow.py").write_text(
        "def f():\n    # TODO 1 (exercise 1): part 1 of 2, say what must hold\n    # END TODO 1\n    pass\n\n\n"
        "def g():\n    # TODO 1 (exercise 1): part 2 of 2, `conn.execute(\"PRAGMA foo=1\")`\n    # END TODO 1\n"
        "    pass\n")
    (tmp_path / "solution" / "flow.py").write_text(
        "def f():\n    pass\n\n\ndef g():\n    conn.execute(\"PRAGMA foo=1\")\n    pass\n")
    practice, solution = tmp_path / "practice" / "flow.py", tmp_path / "solution" / "flow.py"
    comment = todo_comments(practice)[1]
    assert comment.startswith("part 1 of 2, say what must hold") and "part 2 of 2" in comment, comment
    assert dictated(added_lines(solution, practice)[0], comment) is not None
