"""starter.py as a newcomer meets it: errors in the format asked for, a live
query with no worker, Ctrl-C on --wait, and a closed pipe. Each says one
thing, with its own exit code, and never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from durable_agents.flowclient.runs import start_run
from lab.processes import REPO, Proc
from tests.support import EMAIL, TASK, wait_closed, wait_exit


def starter(dev_server, *args, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address}
    return subprocess.run([sys.executable, "starter.py", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60, **kwargs)


def test_errors_with_json_are_json_on_stdout(dev_server):
    done = starter(dev_server, "status", "no-such-run-anywhere", "--json")
    assert done.returncode == 2
    answer = json.loads(done.stdout)
    assert answer["exit_code"] == 2 and "no run with id" in answer["error"]
    bad = starter(dev_server, "start", "bad id", TASK, "--email", EMAIL, "--json")
    assert bad.returncode == 2 and "run id" in json.loads(bad.stdout)["error"]
    plain = starter(dev_server, "status", "no-such-run-anywhere")
    assert plain.returncode == 2 and plain.stdout == "" and plain.stderr.startswith("error: no run with id")


async def test_live_status_with_no_worker_says_so_in_one_line(client, dev_server, workers, provider, run_id,
                                                               task_queue):
    worker = workers()
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
    await wait_closed(client, run_id)
    worker.kill()
    done = starter(dev_server, "status", run_id, "--live")
    assert done.returncode == 4, done
    assert done.stderr.count("\n") == 1 and "no worker answered" in done.stderr and "Traceback" not in done.stderr
    assert starter(dev_server, "status", run_id).returncode == 0  # the history needs no worker


async def test_ctrl_c_on_wait_leaves_quietly_and_the_run_goes_on(client, dev_server, workers, provider, run_id,
                                                                   task_queue):
    workers(extra_env={"LAB_STEP_SECONDS": "2"})
    env = {"TEMPORAL_ADDRESS": dev_server.address, "TASK_QUEUE": task_queue, "PYTHONUNBUFFERED": "1"}
    # As from a terminal: Ctrl-C's SIGINT at its default. A test run started in the background
    # (`make test &`, or a CI runner that does so) hands its children SIGINT ignored, and
    # Python then never raises KeyboardInterrupt at all.
    as_from_a_terminal = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                          "sys.argv = sys.argv[1:]; runpy.run_path('starter.py', run_name='__main__')")
    waiting = Proc("starter", [sys.executable, "-c", as_from_a_terminal, "starter.py", "start", run_id, TASK,
                               "--email", EMAIL, "--wait"], env=env)
    waiting.wait_for_line("draft: running", timeout=60)
    os.kill(waiting.pid, signal.SIGINT)
    assert wait_exit(waiting, 30) == 130, waiting.output()
    assert "interrupted: the run goes on in Temporal" in waiting.output()
    assert "Traceback" not in waiting.output() and "KeyboardInterrupt" not in waiting.output()
    status = await wait_closed(client, run_id)
    assert status["status"] == "completed"


async def test_a_closed_pipe_is_quiet(client, dev_server, workers, provider, run_id, task_queue):
    workers()
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
    await wait_closed(client, run_id)
    env = {**os.environ, "TEMPORAL_ADDRESS": dev_server.address}
    # `true` exits at once: every write the starter makes meets a closed pipe.
    done = subprocess.run(["bash", "-c", f"{sys.executable} starter.py status {run_id} | true; "
                                         "echo \"exit=${PIPESTATUS[0]}\""],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.stderr == "", done.stderr
    assert done.stdout.strip() in ("exit=141", "exit=0"), done.stdout


async def test_the_documented_status_json_has_the_real_shape(client, dev_server, workers, provider, run_id, task_queue):
    import re

    page = (REPO / "docs" / "commands.md").read_text()  # "A run's state"
    shown = json.loads(re.search(r"<!-- status-json -->\n```json\n(.*?)\n```", page, re.S).group(1))
    workers()
    await start_run(client, run_id, TASK, EMAIL, queue=task_queue)
    await wait_closed(client, run_id)
    done = starter(dev_server, "status", run_id, "--json")
    real = json.loads(done.stdout)
    assert list(shown) == list(real)
    # the page shows some steps
    assert all(list(a) == list(b) for a, b in zip(shown["steps"], real["steps"], strict=False))
    assert set(shown["steps"][0]["result"]) <= set(real["steps"][0]["result"])
    assert done.stdout.startswith("{\n  \"run_id\"")  # indented, as the page says
