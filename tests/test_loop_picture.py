"""The agent loop's picture (``lesson.loop_scenario --html``, ``lesson.loop_page``; docs/loop.png), in a real
browser.

One play of the loop scenario, one run per engine (Temporal, the run record, DBOS when installed), on the
processes the engines share here: the session's dev server, a provider and a model stand-in of this module's
own, which the test reads itself afterwards (the provider's effects per key, the stand-in's requests per run
and turn). Each run is SIGKILLed right after the first refund is applied and resumed by a fresh process.
Then the page is opened in headless Chromium (``lab.browser``) and the assertions are on the DOM it
rendered: a lane per engine with its six turns, the kill and the restart; the interrupted refund drawn twice,
killed and then executed again under the same key and applied once; no turn marked asked again, the turns
recorded before the kill taken from the record; the summary's numbers those of the provider and the stand-in.

Chromium missing is a failure that says how to install it, not a skip."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from durable_agents.providerclient import fetch_effects
from durable_agents.testing.standin import start_model_standin, turns_asked
from lab.browser import NoChromium, chromium, dom
from lab.provider_process import start_provider
from lesson.loop_page import loop_page
from lesson.loop_scenario import HAVE_DBOS, LABELS, MODEL_DELAY, LoopScenario
from tests.support import Node, parse_page

pytestmark = [pytest.mark.process, pytest.mark.browser]

ENGINES = ["temporal", "runrecord"] + (["dbos"] if HAVE_DBOS else [])
TURN_ROW = re.compile(r"turn-\d+")
KILLED_CALL = "turn-2/call-0"  # the first refund: CRASH_AT=tool:issue_refund:after_effect
RECORDED_AT_KILL = {"turn-1", "turn-1/call-0", "turn-2"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def played(dev_server, tmp_path_factory) -> AsyncIterator[dict[str, Any]]:
    """The scenario played once; its page as Chromium rendered it; the provider's and the stand-in's counts."""
    try:
        chromium()
    except NoChromium as err:
        pytest.fail(str(err))
    work = tmp_path_factory.mktemp("loop-picture")
    provider = start_provider(work / "provider.db")
    standin, standin_url = start_model_standin(delay=MODEL_DELAY)
    try:
        lines: list[str] = []
        results = await LoopScenario(work, lines.append, uuid.uuid4().hex[:8]).play_on(
            dev_server, provider.url, standin_url)
        page = work / "loop.html"
        page.write_text(loop_page(results))
        rendered = parse_page(await asyncio.to_thread(dom, page.resolve().as_uri()))
        runs = {obs.engine: obs.run_id for obs in results}
        # Read here, from the provider and the stand-in themselves: not the scenario's word for them.
        effects = {engine: fetch_effects(provider.url, run_id=run) for engine, run in runs.items()}
        asked = {engine: turns_asked(standin_url, run) for engine, run in runs.items()}
        yield {"page": rendered, "runs": runs, "effects": effects, "asked": asked, "lines": lines}
    finally:
        standin.kill()
        provider.stop()


def lanes_of(page: Node) -> dict[str, Node]:
    return {lane.attrs["data-engine"]: lane for lane in page.all("section", cls="lane")}


def label(g: Node) -> str:
    texts = g.all("text")
    return texts[0].text() if texts else ""


def executed(lane: Node) -> list[Node]:
    """The bars of executions (turns asked, calls run), not of what was taken from the record or waited for, nor
    the processes' row."""
    return [g for g in lane.all("g", cls="span")
            if not {"read", "replayed", "waiting"} & g.classes and g.attrs["data-row"] != "process"]


def test_each_engine_has_a_lane_with_six_turns_the_kill_and_the_restart(played):
    lanes = lanes_of(played["page"])
    assert list(lanes) == ENGINES, list(lanes)
    for engine, lane in lanes.items():
        assert lane.attrs["data-run-id"] == played["runs"][engine]
        turns = [g for g in executed(lane) if TURN_ROW.fullmatch(g.attrs["data-row"])]
        assert sorted(g.attrs["data-row"] for g in turns) == [f"turn-{n}" for n in range(1, 7)], (
            engine, [g.attrs["data-row"] for g in turns])
        # Each turn labelled with its number and its calls (in short where its row has no room for their names):
        # turns 2 and 4 carry the refund then the email; the last one is the answer.
        by_row = {g.attrs["data-row"]: label(g) for g in turns}
        calls = {1: "lookup_order", 2: "issue_refund, send_email", 3: "lookup_order", 4: "issue_refund, send_email",
                 5: "create_ticket", 6: "the final answer"}
        short = {1: "1 call", 2: "2 calls", 3: "1 call", 4: "2 calls", 5: "1 call", 6: "the answer"}
        for n in range(1, 7):
            assert by_row[f"turn-{n}"] in (f"turn {n}: {calls[n]}", f"turn {n}: {short[n]}"), (engine, by_row)
        # The calls' rows, under their turns, name their tools.
        rows = [t.text() for t in lane.all("text", cls="row")]
        assert rows[rows.index("turn 2") + 1: rows.index("turn 2") + 3] == ["call 0: issue_refund",
                                                                            "call 1: send_email"], rows
        kills = lane.all("g", cls="kill")
        assert len(kills) == 1 and "observed" in kills[0].classes, (engine, [k.attrs for k in kills])
        assert len(lane.all("g", cls="restart")) == 1, engine
        assert "bad" not in lane.classes, engine
    assert [g.classes for g in lanes["temporal"].all("g", cls="replay")] == [{"mark", "replay", "record"}]


def test_the_interrupted_refund_ran_again_under_its_key_and_was_applied_once(played):
    for engine, lane in lanes_of(played["page"]).items():
        reruns = lane.all("g", cls="rerun")
        assert [g.attrs["data-row"] for g in reruns] == [KILLED_CALL], (engine, [g.attrs for g in reruns])
        rerun = reruns[0]
        assert rerun.attrs["data-replayed"] == "true" and rerun.attrs["data-process"] == "2", rerun.attrs
        # Its tooltip says what the provider did (its label, drawn where the row has room, says it short).
        note = rerun.all("title")[0].text()
        assert "executed again" in note and "1 request(s) with it and applied 1" in note and "lookup" in note, note
        killed = [g for g in executed(lane) if g.attrs["data-row"] == KILLED_CALL and "rerun" not in g.classes]
        assert len(killed) == 1 and killed[0].attrs["data-process"] == "1", (engine, [g.attrs for g in killed])
        tail = rerun.attrs["data-key-tail"]
        assert killed[0].attrs["data-key-tail"] == tail, (killed[0].attrs, tail)
        # The key's tail on both bars (where their row has room): the same key.
        assert label(killed[0]) in (f"issue_refund \u2026{tail}, killed", f"\u2026{tail} killed", ""), label(killed[0])
        assert label(rerun) in (f"\u2026{tail} again: looked up by its key, applied once",
                                f"\u2026{tail} again, applied once", ""), label(rerun)
        # The provider's record of that key: one request (the retry looked it up), one refund applied; every
        # other key once too.
        (key,) = [e for e in played["effects"][engine] if e.key.endswith(tail)]
        assert (key.kind, key.requests, key.effects_applied) == ("refund", 1, 1), key
        assert f"/{played['runs'][engine]}/turn-2/call-0-" in key.key, key.key
        shown = lane.all("li", cls="effect", data_key=key.key)
        assert len(shown) == 1 and "applied" in shown[0].classes and "second" not in shown[0].classes
        assert "1 request," in shown[0].text() and "more request" not in shown[0].text(), shown[0].text()
        assert all(e.requests == 1 for e in played["effects"][engine])
        # No other call ran twice; nothing on the page is marked a duplicate.
        calls = Counter(g.attrs["data-row"] for g in executed(lane) if "/" in g.attrs["data-row"])
        assert {row: n for row, n in calls.items() if n > 1} == {KILLED_CALL: 2}, (engine, calls)
        assert not lane.all("li", cls="second") and not lane.all("text", cls="bad"), engine


def test_no_turn_is_asked_again_and_the_recorded_ones_are_taken_from_the_record(played):
    for engine, lane in lanes_of(played["page"]).items():
        asked = played["asked"][engine]
        assert asked == {str(n): 1 for n in range(1, 7)}, (engine, asked)  # the stand-in's own count
        assert not lane.all("g", cls="again"), (engine, [g.attrs for g in lane.all("g", cls="again")])
        for g in executed(lane):
            if TURN_ROW.fullmatch(g.attrs["data-row"]):
                assert g.attrs["data-asked"] == str(asked[g.attrs["data-row"][5:]]), g.attrs
        taken = [g for g in lane.all("g", cls="span") if {"read", "replayed"} & g.classes]
        assert {g.attrs["data-row"] for g in taken} == RECORDED_AT_KILL, (engine, [g.attrs for g in taken])
        assert all(label(g).endswith("not asked") and g.attrs["data-asked"] == "1"
                   for g in taken if TURN_ROW.fullmatch(g.attrs["data-row"])), engine
        # Those recorded before the kill ran once, in the killed process; everything after, in the new one.
        for g in executed(lane):
            row = g.attrs["data-row"]
            if row in RECORDED_AT_KILL:
                assert g.attrs["data-process"] == "1", (engine, g.attrs)
            elif row != KILLED_CALL:
                assert g.attrs["data-process"] == "2", (engine, g.attrs)


def numbers(cell: str) -> list[float]:
    return [float(n) for n in re.findall(r"\d+(?:\.\d+)?", cell)]


def test_the_summary_is_the_provider_s_and_the_stand_in_s_count(played):
    page = played["page"]
    table = page.all("table", cls="summary")[0]
    head = [th.text() for th in table.all("th")]
    assert head == ["engine", "turns", "tool calls", "model asked (stand-in)", "effects applied (provider)",
                    "kill to completed", "check"], head
    rows = {LABELS[engine]: engine for engine in ENGINES}
    seen = []
    for tr in table.all("tbody")[0].all("tr"):
        cells = [td.text() for td in tr.all("td")]
        engine = rows[cells[0]]
        seen.append(engine)
        lane = lanes_of(page)[engine]
        effects, asked = played["effects"][engine], played["asked"][engine]
        kinds = Counter()
        for e in effects:
            kinds[e.kind] += e.effects_applied
        turn_rows = {g.attrs["data-row"] for g in lane.all("g", cls="span") if TURN_ROW.fullmatch(g.attrs["data-row"])}
        call_rows = {g.attrs["data-row"] for g in lane.all("g", cls="span") if "/" in g.attrs["data-row"]}
        call_bars = [g for g in executed(lane) if "/" in g.attrs["data-row"]]
        assert numbers(cells[1]) == [len(asked)] == [len(turn_rows)], cells
        assert numbers(cells[2]) == [len(call_rows), len(call_bars)] == [7, 8], cells
        assert numbers(cells[3]) == [sum(asked.values()), len(asked)] and "none asked again" in cells[3], cells
        assert numbers(cells[4]) == [sum(kinds.values()), sum(e.requests for e in effects),
                                     kinds["refund"], kinds["email"], kinds["ticket"]] == [5, 5, 2, 2, 1], cells
        assert cells[4].endswith("2 refunds, 2 emails, 1 ticket"), cells
        took = numbers(cells[5])
        assert len(took) == 1 and 0 < took[0] < 120, cells
        assert cells[6] == "as expected", (cells, played["lines"])
    assert seen == ENGINES
