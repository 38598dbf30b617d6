"""Grading a class (``python -m grader.grade N --class DIR``) and the grader's JSON (``--json``, ``--report``).

The class is exercise 2's check alone (the fastest) over submissions a course would see: the solution (passes),
a wrong answer (its check fails with its message and TODO), a typo (the program cannot run), a program that
hangs (failed by the grading's deadline), and a folder with no flow.py. Each is graded by a grader process of
its own; the one that fails, crashes or hangs fails alone, and nothing is left running.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grader.classroom import MAX_JOBS
from lab.processes import REPO
from tests.test_grader import FOLDERS, INTENT, processes_of

pytestmark = pytest.mark.process

SOLUTION = FOLDERS[2] / "solution"
README = (REPO / "exercises" / "README.md").read_text()
STARTED = '        say(f"step {name} started: run {inputs.run_id}")\n'
CALL = "        results[name] = asdict(await call_step(name, step, request, deps))\n"


def submission(folder: Path, old: str = "", new: str = "") -> Path:
    """Exercise 2's solution copied to ``folder``, with ``old`` replaced by ``new`` (once) in its flow.py."""
    shutil.copytree(SOLUTION, folder)
    if old:
        text = (folder / "flow.py").read_text()
        assert text.count(old) == 1, f"the solution no longer has {old!r}"
        (folder / "flow.py").write_text(text.replace(old, new))
    return folder


def grade(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "grader.grade", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def documented(field: str) -> bool:
    """The field is in exercises/README.md's table of the JSON's fields."""
    return re.search(rf"^\| `{re.escape(field)}` \|", README, re.M) is not None


def test_a_class_is_graded_each_submission_alone_into_one_table_and_one_json(tmp_path):
    klass = tmp_path / "class"
    submission(klass / "ada")
    submission(klass / "bob", INTENT + STARTED + CALL, STARTED + CALL + "        if name in EFFECTS:\n" + INTENT)
    submission(klass / "cy", "INSERT INTO intents VALUES", "INSERT INTO intentz VALUES")  # a typo: no such table
    submission(klass / "dee", STARTED + CALL, STARTED + "        await asyncio.sleep(3600)\n" + CALL)  # hangs
    (klass / "eve").mkdir()  # handed in nothing
    (klass / ".git").mkdir()  # not a learner
    jobs = str(MAX_JOBS)
    done = grade("2", "--class", str(klass), "--only", "2", "--jobs", jobs, "--report", str(tmp_path / "class.json"),
                 env={"GRADER_PROCESS_SECONDS": "10"})  # long enough for a loaded machine
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((tmp_path / "class.json").read_text())
    learners = {entry["learner"]: entry for entry in report["learners"]}
    assert list(learners) == ["ada", "bob", "cy", "dee", "eve"], done.stdout
    assert {name: entry["verdict"] for name, entry in learners.items()} == {
        "ada": "passed", "bob": "failed", "cy": "could_not_run", "dee": "failed", "eve": "bad_input"}, done.stdout
    assert report["checks"] == [2] and report["jobs"] == MAX_JOBS and report["exit"] == 1

    (ada,), (bob,), (cy,), (dee,) = (learners[n]["checks"] for n in ("ada", "bob", "cy", "dee"))
    assert ada["status"] == "passed" and ada["processes"] == 2 and len(ada["shown"]) == 2 and ada["seconds"] > 0
    assert bob["status"] == "failed" and "records the intent only after the request went out" in bob["headline"]
    assert bob["todos"] == [4] and bob["todo"].startswith("TODO 4 (exercise 2) in flow.py") and bob["expected"]
    assert cy["status"] == "failed" and "no such table: intentz" in cy["traceback"], cy
    assert dee["status"] == "failed" and "was still running after 10 s (killed)" in dee["headline"], dee
    assert "no flow.py there" in learners["eve"]["message"] and learners["eve"]["exit"] == 2

    # One table: a row per learner, a column per check, the verdict and the time; each failure in one line.
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.split()[:1] in
            (["ada"], ["bob"], ["cy"], ["dee"], ["eve"])}
    assert rows["ada"][1:3] == ["pass", "passed"] and rows["bob"][1:3] == ["FAIL", "failed"], done.stdout
    assert rows["cy"][1:3] == ["FAIL", "could_not_run"] and rows["eve"][1:3] == ["-", "bad_input"], done.stdout
    assert "bob: check 2: " in done.stdout and "(look at TODO 4 (exercise 2)" in done.stdout, done.stdout

    # Every field of the JSON is documented; and nothing the class started is left running.
    fields = {*report, *learners["ada"], *ada}
    assert [f for f in sorted(fields) if not documented(f)] == [], "fields missing from exercises/README.md"
    assert processes_of(str(tmp_path)) == []


def test_a_grading_that_runs_past_its_time_is_stopped_and_fails_alone(tmp_path):
    """A hang the grading's own deadlines do not end (here they are made long) is stopped by the class runner:
    SIGTERM, through the grading's cleanup; the next submission is still graded."""
    klass = tmp_path / "class"
    submission(klass / "ann", STARTED + CALL, STARTED + "        await asyncio.sleep(3600)\n" + CALL)
    submission(klass / "ben", "INSERT INTO intents VALUES", "INSERT INTO intentz VALUES")
    done = grade("2", "--class", str(klass), "--only", "2", "--json",
                 env={"GRADER_PROCESS_SECONDS": "600", "GRADER_SUBMISSION_SECONDS": "12"})
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)  # --json: the JSON alone on stdout, the progress and the table on stderr
    ann, ben = report["learners"]
    assert ann["verdict"] == "did_not_finish" and "still running after 12 s" in ann["message"], ann
    assert ben["verdict"] == "could_not_run", ben
    assert "ann" in done.stderr and "did_not_finish" in done.stderr, done.stderr
    assert processes_of(str(tmp_path)) == []


def test_bad_input_to_a_class_or_a_json_grading_is_exit_2_and_says_why(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "one" / "ada").mkdir(parents=True)
    cases = [
        (["2", "--class", str(tmp_path / "none")], "no such folder"),
        (["2", "--class", str(tmp_path / "empty")], "it has no subfolder"),
        (["2", "--class", str(tmp_path / "one"), "--jobs", str(MAX_JOBS + 1)], f"at most {MAX_JOBS}"),
        (["2", "--class", str(tmp_path / "one"), "--impl", "solution"], "give no --impl"),
        (["2", "--jobs", "2"], "only with --class"),
    ]
    for args, needle in cases:
        done = grade(*args, timeout=60)
        assert done.returncode == 2 and needle in done.stderr, (args, done.stdout + done.stderr)
    done = grade("2", "--impl", str(tmp_path / "empty"), "--json", timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    refused = json.loads(done.stdout)
    assert refused["verdict"] == "bad_input" and "no flow.py there" in refused["message"] and refused["exit"] == 2


def test_a_part_this_machine_cannot_do_is_reported_skipped_and_changes_no_exit_code(tmp_path):
    """Without fusermount3 on PATH (FUSE unavailable), check 1 runs its kills without power cuts: it passes, says
    why the cuts were skipped, and the JSON lists that under ``skipped``."""
    done = grade("1", "--impl", "solution", "--only", "1", "--json", env={"PATH": str(tmp_path)})
    assert done.returncode == 0, done.stdout + done.stderr
    (check,) = json.loads(done.stdout)["checks"]
    assert check["status"] == "passed" and len(check["skipped"]) == 1, check
    assert check["skipped"][0].startswith("power cuts skipped: fusermount3 is missing"), check
