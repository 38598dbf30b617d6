"""The lesson's runnable path keeps working: the scenario's table on all three
engines (real provider, dev server and workers, started and stopped by the
scenario itself), and every command LAB.md marks with ``lab-check``, run in
order against a real provider with its expected exit code and output."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from durable_agents.steps.plan import STEP_NAMES
from lab.processes import REPO
from lesson.scenario import EXPECTED, HAVE_DBOS, Observed
from tests.support import parse_page

LAB = REPO / "LAB.md"
CHECK = re.compile(r"<!-- lab-check(?P<attrs>(?:(?!-->).)*)-->\s*\n```sh\n(?P<body>.*?)\n```", re.S)
ATTR = re.compile(r'([a-z][a-z-]*)=("(?:[^"\\]|\\.)*"|\S+)')


def lab_checks() -> list[dict]:
    """The marked blocks of LAB.md, in order: one command each, with its expectations."""
    checks = []
    for match in CHECK.finditer(LAB.read_text()):
        spec: dict = {"command": match["body"].strip(), "exit": 0, "expect": [], "absent": [], "retry": None,
                      "needs": None}
        assert "\n" not in spec["command"], f"one command per lab-check block: {spec['command']!r}"
        for name, raw in ATTR.findall(match["attrs"]):
            value = raw[1:-1].replace('\\"', '"') if raw.startswith('"') else raw
            if name == "exit":
                spec["exit"] = int(value)
            elif name in ("expect", "absent"):
                spec[name].append(value)
            elif name == "retry-while-exit":
                spec["retry"] = int(value)
            elif name == "needs":  # an optional extra, e.g. needs=dbos: run only where it is installed
                spec["needs"] = value
            else:
                raise AssertionError(f"unknown lab-check attribute {name!r} in LAB.md")
        checks.append(spec)
    # A marker the pattern did not pair with its block would be skipped silently: refuse that.
    assert len(checks) == LAB.read_text().count("<!-- lab-check"), "a lab-check marker is not followed by a sh block"
    return checks


def test_lab_md_marks_enough_commands_and_follows_the_lesson_order():
    checks = lab_checks()
    assert len(checks) >= 20, [c["command"] for c in checks]
    text = LAB.read_text()
    headings = [
        "## The starting point: a flow held in memory",
        "## Lab step 1: model the run record",
        "## Lab step 2: record each effect before advancing",
        "## Lab step 3: resume by run id",
        "## Lab step 4: bounded conversation memory",
        "## Lab step 5: the terminal failure state",
        "## Lab step 6: on Temporal, the worker killed mid-run",
        "## More exercises, by hand",
    ]
    positions = [text.index(h) for h in headings]
    assert positions == sorted(positions)
    # Commands not run by lab_checks (they start their own servers): covered by the scenario test below.
    for command in ("make scenario", "python -m lesson.scenario", "python -m provider --db .state/provider.db"):
        assert command in text
    # The quick check: the question where the learner meets it, the answer only in the grader's output.
    question = "A four-step job crashes after step two"
    assert question in text and question in (REPO / "exercises" / "03-resume" / "README.md").read_text()
    assert "must **not** send the email again" not in text
    assert "it must not send the email again" in (REPO / "grader" / "quick_check.py").read_text()
    for n in range(1, 7):  # every lab step points at its exercise and its check
        assert f"make grade N={n}" in text, n


def test_lab_md_points_at_code_that_exists():
    text = LAB.read_text()
    paths = set(re.findall(r"`((?:[a-z_]+/)+[a-z_]+\.py)`", text))
    assert len(paths) >= 10, paths
    missing = [p for p in paths if not (REPO / p).exists()]
    assert not missing, missing
    # Functions and classes named next to their files.
    sources = {
        "durable_agents/runrecord/runner.py": ("def _one_step", "def resume", "def check_flow", "def _fail",
                                               "def restart_failed"),
        "durable_agents/runrecord/store.py": ("def begin_attempt", "def complete_step"),
        "durable_agents/steps/plan.py": ("FLOW",),
        "durable_agents/steps/requests.py": ("def send_request", "def record_request"),
        "durable_agents/steps/retry.py": ("StepLedger",),
        "durable_agents/workflows/agent_flow.py": ("def _attempts",),
        "lesson/in_memory.py": ("def run_flow", "def make_key"),
        "durable_agents/wiring/memory.py": ("def memory_from_env",),
        "durable_agents/steps/flow.py": ("def build_prompt",),
    }
    for path, names in sources.items():
        source = (REPO / path).read_text()
        for name in names:
            assert name in source, f"LAB.md names {name} in {path}, which no longer has it"
            assert name.replace("def ", "") in text


def test_lab_md_commands_run_and_show_what_it_says(provider, tmp_path):
    """Each lab-check command, in order, in one shell environment: a real provider,
    the record and memory in tmp_path, the project's python first on PATH."""
    env = {k: v for k, v in os.environ.items() if k != "CRASH_AT"}
    env.update({
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "PROVIDER_URL": provider.url,
        "RUNRECORD_DB": str(tmp_path / "runrecord.db"),
        "MEMORY_DB": str(tmp_path / "memory.db"),
        "DBOSFLOW_DB": str(tmp_path / "dbosflow.db"),
        "PYTHONUNBUFFERED": "1",
    })
    for check in lab_checks():
        if check["needs"] and importlib.util.find_spec(check["needs"]) is None:
            continue  # LAB.md says which extra the block needs; without it, the block cannot run
        deadline = time.monotonic() + 60
        while True:
            done = subprocess.run(["bash", "-c", check["command"]], cwd=REPO, env=env,
                                  capture_output=True, text=True, timeout=180)
            if check["retry"] is None or done.returncode != check["retry"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # a killed runner's lease (1 s) has not expired yet: poll again
        out = done.stdout + done.stderr
        # bash execs a lone command, so a SIGKILL shows as -9 here; a shell's $? says 137 (128 + 9).
        code = 128 - done.returncode if done.returncode < 0 else done.returncode
        shown = f"$ {check['command']}\nexit {code}\n{out}"
        assert code == check["exit"], shown
        for needle in check["expect"]:
            assert needle in out, f"expected {needle!r} in:\n{shown}"
        for needle in check["absent"]:
            assert needle not in out, f"did not expect {needle!r} in:\n{shown}"


def test_observed_table_is_compared_with_the_expected_one():
    good = Observed("runrecord", "r", completed_before=["draft", "send_confirmation"],
                    restarted_executed=["record_outcome"], final_status="completed",
                    effects={"send_confirmation": {"keys": 1, "requests": 1, "applied": 1},
                             "record_outcome": {"keys": 1, "requests": 1, "applied": 1}})
    assert good.ok and good.comparable() == EXPECTED["runrecord"]
    rerun = Observed("runrecord", "r", completed_before=["draft", "send_confirmation"],
                     restarted_executed=list(STEP_NAMES), final_status="completed", effects=good.effects)
    assert not rerun.ok and rerun.resumed_at == "draft" and rerun.executed_again == ["draft", "send_confirmation"]
    twice = Observed("temporal", "t", completed_before=["draft", "send_confirmation"],
                     restarted_executed=["record_outcome"], final_status="completed",
                     effects={**good.effects, "send_confirmation": {"keys": 1, "requests": 2, "applied": 2}})
    assert not twice.ok


@pytest.mark.process
def test_scenario_restarts_every_engine_between_step_2_and_3(tmp_path):
    page = tmp_path / "page" / "scenario.html"
    done = subprocess.run([sys.executable, "-m", "lesson.scenario", "--json", "--state-dir", str(tmp_path),
                           "--html", str(page)], cwd=REPO, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    engines = {e["engine"]: e for e in report["engines"]}
    durable_engines = ["runrecord", "temporal"] + (["dbos"] if HAVE_DBOS else [])
    assert list(engines) == ["in_memory", *durable_engines] and report["ok"] is True
    # --html: the same runs as one page, a lane per engine (tests/test_pictures.py looks at it in a browser).
    assert f"the picture of it: {page}" in done.stderr
    lanes = parse_page(page.read_text()).all("section", cls="lane")
    assert [(lane.attrs["data-engine"], lane.attrs["data-run-id"]) for lane in lanes] == [
        (e["engine"], e["run_id"]) for e in report["engines"]]

    before = engines["in_memory"]
    assert before["resumed_at"] == "draft" and before["resumed_at_position"] == 1
    assert before["executed_again"] == ["draft", "send_confirmation"]
    emails = [k for k in before["keys"] if k["kind"] == "email"]
    assert len(emails) == 2 and all(k["applied"] == 1 and k["requests"] == 1 for k in emails), before["keys"]
    assert before["effects"]["send_confirmation"]["applied"] == 2
    assert before["effects"]["record_outcome"] == {"keys": 1, "requests": 1, "applied": 1}

    # How each durable engine knew: the record was read; the history was replayed, its activities not run.
    assert "send_confirmation completed (its recorded result is used" in engines["runrecord"]["how_it_knew"]
    assert "draft attempt 1, send_confirmation attempt 1 came from history, not executed again" in \
        engines["temporal"]["how_it_knew"], engines["temporal"]
    if HAVE_DBOS:  # DBOS recovered the run on launch; the step rows it had recorded were not run again
        assert engines["dbos"]["how_it_knew"].startswith("launched DBOS"), engines["dbos"]
    for name in durable_engines:
        durable = engines[name]
        assert durable["completed_before_restart"] == ["draft", "send_confirmation"], durable
        assert durable["resumed_at"] == "record_outcome" and durable["resumed_at_position"] == 3, durable
        assert durable["restarted_process_executed"] == ["record_outcome"], durable
        assert durable["executed_again"] == [] and durable["final_status"] == "completed", durable
        assert len(durable["keys"]) == 2 and all(k["applied"] == 1 for k in durable["keys"]), durable
    # Everything the scenario started is gone.
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout == "", leftovers.stdout


@pytest.mark.process
def test_scenario_deploy_on_every_engine(tmp_path):
    """The restart that is a deploy (lesson/deploy.py): the record refuses a changed
    flow, Temporal parks an unversioned change to the recorded past, takes a
    patched one in its stride and runs a step added after the waiting point, a
    changed retry rule changes nothing for a waiting run, and a move to another
    worker or directory finishes the run; no effect happens twice on a durable
    engine."""
    done = subprocess.run([sys.executable, "-m", "lesson.scenario", "--deploy", "--json", "--state-dir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    rows = {(r["engine"], r["change"]): r for r in report["rows"]}
    assert report["ok"] and len(rows) == 10, report
    assert rows["runrecord", "before"]["with the new code"] == "refused: the flow changed (exit 6)"
    assert rows["runrecord", "after"]["with the new code"] == "refused: the flow changed (exit 6)"
    assert rows["temporal", "after"]["with the new code"] == "finished at step 3 record_outcome, through the new pause"
    assert rows["temporal", "before"]["with the new code"] == "parked: NON_DETERMINISTIC_ERROR"
    assert rows["temporal", "before, versioned"]["then"] == "a run started now takes the new path"
    assert rows["in_memory", "before"]["email applied"] == 2
    for (engine, _change), row in rows.items():
        if engine != "in_memory":
            assert (row["email applied"], row["ticket applied"]) == (1, 1), row
            assert "draft" not in row["steps run again by the new code"], row
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout == "", leftovers.stdout


def test_effects_counts_an_agent_loops_tool_calls_per_kind_not_as_the_flows_steps():
    """A loop run's keys name turns and calls: its totals are per kind of effect, never labelled with the
    three-step flow's step names (which it does not have); a flow run's stay per step."""
    from durable_agents.providerclient import EffectRecord
    from lesson.effects import LOOP_KEY, per_kind, per_step

    def effect(key: str, kind: str, requests: int) -> EffectRecord:
        return EffectRecord(key=key, kind=kind, run_id="r", requests=requests, effects_applied=1, status_code=200,
                            first_seen="t", last_seen="t")

    loop = [effect("agentlab/r/turn-2/call-0-0123456789abcdef", "refund", 2),
            effect("agentlab/r/turn-2/call-1-0123456789abcdef", "email", 1),
            effect("agentlab/r/turn-3/call-0-0123456789abcdef", "ticket", 1)]
    assert all(LOOP_KEY.search(e.key) for e in loop)
    assert per_kind(loop) == {"refund (tool calls)": {"keys": 1, "requests": 2, "applied": 1},
                              "email (tool calls)": {"keys": 1, "requests": 1, "applied": 1},
                              "ticket (tool calls)": {"keys": 1, "requests": 1, "applied": 1}}
    flow = [effect("agentlab/r/send_confirmation", "email", 1)]
    assert not LOOP_KEY.search(flow[0].key)
    assert per_step(flow)["send_confirmation"] == {"keys": 1, "requests": 1, "applied": 1}
