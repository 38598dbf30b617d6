"""``python -m grader.show`` reads exercise 7's record too (its ``turns`` and ``calls``), not only the record
of exercises 1-5, as exercises/README.md offers it for every exercise with a record."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing

import pytest

from lab.processes import REPO

pytestmark = pytest.mark.process

SCHEMA_FROM = REPO / "exercises" / "07-agent-loop" / "practice" / "agent_loop.py"


def schema() -> str:
    namespace: dict[str, object] = {}
    text = SCHEMA_FROM.read_text()
    start = text.index('SCHEMA = """')
    exec(text[start:text.index('"""', start + 11) + 3], namespace)  # the given SCHEMA constant, as the learner has it
    return str(namespace["SCHEMA"])


def test_show_prints_an_agent_loop_runs_turns_and_calls(tmp_path):
    db = tmp_path / "exercise7-record.db"
    with closing(sqlite3.connect(db)) as conn:
        conn.executescript(schema())
        conn.execute("INSERT INTO runs VALUES ('ex7-a', 'Refund order A-1', 'ada@example.com', 'running')")
        calls = [{"id": "call 1", "name": "issue_refund", "arguments": "{}"},
                 {"id": "call 1", "name": "send_email", "arguments": "{}"}]
        conn.execute("INSERT INTO turns VALUES ('ex7-a', 1, ?)", (json.dumps({"content": None, "calls": calls}),))
        conn.execute("INSERT INTO calls VALUES ('ex7-a', 1, 0, 'agentlab/ex7-a/turn-1/call-0-abc', ?)",
                     (json.dumps({"status": "ok", "content": {"refunded": 4200}}),))
        conn.commit()
    shown = subprocess.run([sys.executable, "-m", "grader.show", "ex7-a", "--db", str(db)], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "runs     ex7-a: status 'running'" in shown.stdout
    assert "turns    1: issue_refund(id 'call 1'), send_email(id 'call 1')" in shown.stdout
    assert "calls    1/0: key agentlab/ex7-a/turn-1/call-0-abc; ok" in shown.stdout
    assert "calls    1/1: no result recorded" in shown.stdout
    missing = subprocess.run([sys.executable, "-m", "grader.show", "ex7-b", "--db", str(db)], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no run ex7-b" in missing.stderr
