"""The two pages a learner looks at, in a real browser: the scenario's page
(``lesson.scenario_page``) and the provider's inbox (``GET /inbox``).

One run of ``python -m lesson.pictures`` (the command that regenerates
docs/scenario.png and docs/inbox.png) plays the scenario with a hostile task,
keeps its files, and takes both screenshots. Then each page is opened in
headless Chromium (``lab.browser``, the installation ``make ui-check`` uses)
and the assertions are on the DOM Chromium rendered, not on the HTML sent:
one lane per engine, a kill mark on each, the emails the provider applied
under each lane (two under the "before"), the inbox's duplicate mark on the
"before" run only, and the hostile task shown as text, never run.

Chromium missing is a failure that says how to install it, not a skip."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest

from lab.browser import NoChromium, chromium, dom
from lab.processes import REPO
from lab.provider_process import start_provider
from lesson.scenario import HAVE_DBOS
from tests.support import Node, parse_page

pytestmark = [pytest.mark.process, pytest.mark.browser]

# Markup that would run if a page put it in as markup: each sets an attribute on the root element.
SCRIPT = '<script>document.documentElement.setAttribute("data-pwned", "script")</script>'
IMAGE = "<img src=x onerror=\"document.documentElement.setAttribute('data-pwned', 'img')\">"
PREFIX = f"Refund {SCRIPT} {IMAGE} \"double\" and 'single' quotes & an ampersand. "
HOSTILE = PREFIX + "y" * (4000 - len(PREFIX))  # one line: the draft's body quotes it, a 4,000-character line


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def assert_inert(page: Node, where: str) -> None:
    """Nothing the runs carried became markup: no script or image element, no attribute set by one."""
    assert page.all("script") == [] and page.all("img") == [], where
    assert [n for n in page.all() if "data-pwned" in n.attrs] == [], where


@pytest.fixture(scope="module")
def pictures(tmp_path_factory) -> dict[str, Path]:
    try:
        chromium()
    except NoChromium as err:
        pytest.fail(str(err))
    work = tmp_path_factory.mktemp("pictures")
    done = subprocess.run([sys.executable, "-m", "lesson.pictures", "--out", str(work / "out"), "--state-dir",
                           str(work / "state"), "--task", HOSTILE], cwd=REPO, capture_output=True, text=True,
                          timeout=420)
    assert done.returncode == 0, done.stdout + done.stderr
    leftovers = subprocess.run(["pgrep", "-f", str(work)], capture_output=True, text=True)
    assert leftovers.stdout == "", f"left running: {leftovers.stdout}"
    return {"out": work / "out", "state": work / "state"}


def test_the_command_regenerates_both_screenshots(pictures):
    for name in ("scenario.png", "inbox.png"):
        shot = pictures["out"] / name
        width, height = png_size(shot)
        assert width >= 1000 and height >= 900, (name, width, height)
        assert shot.stat().st_size < 600_000, f"{name} is {shot.stat().st_size} bytes: keep the docs light"


def test_the_scenario_page_draws_each_engine_in_the_browser(pictures):
    page = parse_page(dom((pictures["state"] / "scenario.html").resolve().as_uri()))
    lanes = {lane.attrs["data-engine"]: lane for lane in page.all("section", cls="lane")}
    durable = ["runrecord", "temporal"] + (["dbos"] if HAVE_DBOS else [])
    assert list(lanes) == ["in_memory", *durable], list(lanes)

    for name, lane in lanes.items():
        kills = lane.all("g", cls="kill")
        assert len(kills) == 1 and "observed" in kills[0].classes, (name, [k.attrs for k in kills])
        assert len(lane.all("g", cls="restart")) == 1, name
        emails = lane.all("li", cls="email")
        applied = [e for e in emails if "applied" in e.classes]
        assert len(applied) == (2 if name == "in_memory" else 1), (name, [e.text() for e in emails])
        assert len(lane.all("li", cls="ticket")) == 1, name

    # The "before" keeps no record: all of its bars are observations, and the restart ran steps 1 and 2 again.
    before = lanes["in_memory"]
    assert before.all("g", cls="span") and not before.all("g", cls="record")
    assert {g.attrs["data-row"] for g in before.all("g", cls="again")} == {"draft", "send_confirmation"}
    assert len(before.all("li", cls="second")) == 1 and "bad" in before.classes
    # The durable engines: steps 1 and 2 drawn from their records, then read or replayed, never run again.
    for name in durable:
        lane = lanes[name]
        recorded = {g.attrs["data-row"] for g in lane.all("g", cls="executed", data_start_from="record")}
        assert recorded == {"draft", "send_confirmation", "record_outcome"}, (name, recorded)
        taken = {g.attrs["data-row"] for g in lane.all("g", cls="span") if {"read", "replayed"} & g.classes}
        assert taken == {"draft", "send_confirmation"}, (name, taken)
        assert not lane.all("g", cls="again") and "bad" not in lane.classes, name
    # Temporal's replay is a time from its history, drawn as a record; the kill is the scenario's observation.
    assert [g.classes for g in lanes["temporal"].all("g", cls="replay")] == [{"mark", "replay", "record"}]

    lead = page.all("p", cls="lead")[0].text()
    assert HOSTILE in lead, "the task is shown whole, as text"
    assert_inert(page, "the scenario's page")


def test_the_inbox_marks_the_before_run_only_in_the_browser(pictures):
    scenario = parse_page((pictures["state"] / "scenario.html").read_text())
    runs = {lane.attrs["data-engine"]: lane.attrs["data-run-id"] for lane in scenario.all("section", cls="lane")}
    with start_provider(pictures["state"] / "provider.db") as provider:
        page = parse_page(dom(f"{provider.url}/inbox"))
    emails = page.all("article", cls="email")
    assert sorted(e.attrs["data-run-id"] for e in emails) == sorted([runs["in_memory"], *runs.values()])
    marked = [e for e in emails if e.all(cls="duplicate")]
    assert [e.attrs["data-run-id"] for e in marked] == [runs["in_memory"]] * 2
    assert all(e.attrs["data-duplicate"] == "no" and "dup" not in e.classes for e in emails if e not in marked)
    assert [p.text() for p in page.all("p", cls="dups")] == [
        f"Run {runs['in_memory']} sent 2 emails: the customer got its confirmation 2 times."]

    for email in emails:
        assert email.all(cls="subject")[0].text().startswith(f"Re: Refund {SCRIPT} {IMAGE}")
        assert f"> Refund {SCRIPT} {IMAGE} \"double\" and 'single' quotes & an ampersand." in \
            email.all("pre")[0].text()
    assert_inert(page, "the inbox")
