"""The pictures LAB.md and docs/agent-loop.md show, made again from real runs:

    make pictures        (or: python -m lesson.pictures [--out DIR] [--state-dir DIR] [--task TASK]
                                                        [--only scenario|loop])

Plays the scenario (``lesson.scenario``: the restart between step 2 and
step 3 on every engine, with its own provider and dev server), draws its
page, then starts a provider on the scenario's store for the customers'
inbox (``GET /inbox``), and takes a screenshot of each in headless Chromium
(``lab.browser``):

- ``DIR/scenario.png``: the scenario's page, a lane per engine;
- ``DIR/inbox.png``: the inbox, the "before" run's two emails marked;
- ``DIR/loop.png``: the agent loop killed right after a refund and resumed on
  every engine (``lesson.loop_scenario``, with a provider, a dev server and a
  model stand-in of its own; its page ``lesson.loop_page``).

``--only scenario`` makes the first two, ``--only loop`` the third.

``DIR`` is docs/ by default, where the pages find them. ``--state-dir`` keeps
the scenarios' files (the pages are ``scenario.html`` and ``loop.html`` there,
the scenario's provider store ``provider.db``, the loop's in ``loop/``), so
the pages can be opened again; without it they are removed. Nothing is left
running. Exit code 0, 1 if a scenario's table was not the expected one (the
pictures are made anyway, so you can see what went wrong), 2 if it could not
be played or drawn.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from durable_agents.steps.controls import printable
from durable_agents.steps.limits import InputError, check_task
from lab.browser import NoChromium, screenshot
from lab.processes import REPO
from lab.provider_process import start_provider
from lesson.loop_page import loop_page
from lesson.loop_scenario import LoopScenario
from lesson.scenario import TASK, Scenario, ScenarioError
from lesson.scenario_page import scenario_page

WIDTH = 1180  # the page's column (1140) and its margins: no empty band at the sides
# Tall enough for the header, the summary, the legend and every lane; the page has no script to measure itself.
SCENARIO_HEADER, SCENARIO_LANE = 420, 350
INBOX_HEADER, INBOX_EMAIL = 150, 222
LOOP_HEADER, LOOP_LANE, LOOP_NOTES = 470, 730, 110
PICTURES = ("scenario", "loop")


def stamp() -> str:
    return f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:6]}"


def make(out: Path, state: Path, task: str, say, only: str | None = None) -> bool:
    """Play, draw, photograph (``only``: one of ``PICTURES``; None: all). True if every table played was the
    expected one."""
    ok = True
    shots: list[Path] = []
    if only in (None, "scenario"):
        ok = make_scenario(out, state, task, say, shots) and ok
    if only in (None, "loop"):
        ok = make_loop(out, state, say, shots) and ok
    for shot in shots:
        shown = shot.resolve().relative_to(REPO) if shot.resolve().is_relative_to(REPO) else shot
        say(f"wrote {shown} ({shot.stat().st_size // 1024} KB)")
    return ok


def make_scenario(out: Path, state: Path, task: str, say, shots: list[Path]) -> bool:
    """docs/scenario.png and docs/inbox.png. True if the scenario's table was the expected one."""
    results = Scenario(state, say, stamp(), task).play()
    page = state / "scenario.html"
    page.write_text(scenario_page(results, task))
    shots.append(screenshot(page.resolve().as_uri(), out / "scenario.png", WIDTH,
                            SCENARIO_HEADER + SCENARIO_LANE * len(results)))
    emails = sum(obs.effects["send_confirmation"]["applied"] for obs in results)
    with start_provider(state / "provider.db") as provider:
        shots.append(screenshot(f"{provider.url}/inbox", out / "inbox.png", WIDTH - 40,
                                INBOX_HEADER + INBOX_EMAIL * emails))
    return all(obs.ok for obs in results)


def make_loop(out: Path, state: Path, say, shots: list[Path]) -> bool:
    """docs/loop.png, from a loop scenario with processes and a store of its own (``state/loop``), so the
    scenario's inbox holds the scenario's emails only. True if its table was the expected one."""
    (state / "loop").mkdir(parents=True, exist_ok=True)
    results = LoopScenario(state / "loop", say, stamp()).play()
    page = state / "loop.html"
    page.write_text(loop_page(results))
    shots.append(screenshot(page.resolve().as_uri(), out / "loop.png", WIDTH,
                            LOOP_HEADER + LOOP_LANE * len(results) + LOOP_NOTES))
    return all(obs.ok for obs in results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lesson.pictures", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="where the PNGs go (default docs/)")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="keep the scenario's files (its page, the provider's store) here")
    parser.add_argument("--task", default=TASK,
                        help="the task every engine runs in the scenario (default: the lesson's)")
    parser.add_argument("--only", choices=PICTURES, default=None,
                        help="make only scenario.png and inbox.png (scenario), or only loop.png (loop)")
    args = parser.parse_args(argv)

    def say(line: str) -> None:
        print(printable(f"==> {line}"), flush=True)

    try:
        task = check_task(args.task)
    except InputError as err:
        print(printable(f"error: {err}"), file=sys.stderr)
        return 2
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="lesson-pictures-"))
    state.mkdir(parents=True, exist_ok=True)
    try:
        ok = make(args.out, state, task, say, args.only)
    except (ScenarioError, NoChromium, TimeoutError, RuntimeError, ConnectionError, OSError) as err:
        print(printable(f"error: the pictures could not be made: {err}", multiline=True), file=sys.stderr)
        return 2
    finally:
        if args.state_dir is None:
            shutil.rmtree(state, ignore_errors=True)
    if not ok:
        print("a scenario's table was not the expected one: look at the pictures, or run make scenario and make "
              "loop-scenario", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
