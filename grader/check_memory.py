"""Check 4. **Bounded memory** (exercise 4): the learner's window under a long stream of appends, the rule checked
after every one (``grader.memory_probe``), side by side with two flow runs for one customer: memory feeds
the second draft's prompt and is never read to decide what was done.
"""

from __future__ import annotations

from functools import partial

from grader.check import Check
from grader.check_resume import resume_and_judge
from grader.expect import (
    expect_completed,
    expect_done,
    expect_killed,
)
from grader.harness import CouldNotRun, Failed, Harness
from grader.todos import todo

MEMORY_BUDGET = 300
MEMORY_APPENDS = 3000


def check_memory(h: Harness) -> list[str]:
    # Side by side: the long exchange is one process of CPU, the flows mostly wait on processes starting.
    return h.side_by_side(partial(long_exchange, h), partial(memory_in_the_flow, h))


def long_exchange(h: Harness) -> str:
    played = h.probe_memory(MEMORY_BUDGET, MEMORY_APPENDS)
    if not played.get("ok"):
        if played.get("rule") == "exception":
            raise CouldNotRun("bounded_memory.py raised during the long exchange", played["traceback"])
        hints = {"budget": "evict whole blocks, oldest first, until the window fits the budget",
                 "pinned": "the system message counts and never goes",
                 "split": "a tool result joins the block of its call; blocks go whole",
                 "once": "an evicted message never comes back",
                 "oversize": "a block too large to keep on its own goes at once",
                 "oldest-first": "evict the oldest block first",
                 "too-much": "evict only while over the budget; a block too large goes alone",
                 "returned": "return the ids this append evicted",
                 "late": "a result whose round was already evicted never enters the window: it goes on arrival",
                 "pinned-evicts": "a new system message counts at once: older blocks make room for it",
                 "pinned-refused": "a system message that leaves no room is refused, the window untouched",
                 "finished-answer": "write BoundedMemory yourself"}
        raise Failed(played["headline"], expected=played["expected"], seen=played["seen"],
                     look_at=todo(played["todo"], hints.get(played["rule"], "the rule in the README")))
    return (f"{played['appends']} appends ({played['tool rounds']} tool rounds, {played.get('late results', 0)} "
            "results arriving after their round was evicted, one message larger than the budget, a larger system "
            f"message replacing the first and one refused, ids appended twice) under a budget of {played['budget']} "
            f"tokens: the rule held after every one ({played['evicted']} messages evicted)")


def memory_in_the_flow(h: Harness) -> str:
    """Memory feeds the prompt, and is never the record."""
    customer = f"ada-{h.new_run('c').run_id[-6:]}@example.com"
    first, second = h.new_run("g4-first"), h.new_run("g4-second")
    first.email = second.email = customer
    expect_completed(h, h.start(first), "`python flow.py start` (the customer's first run)")
    kept = h.saved_memory(customer)
    if f"{first.run_id}/task" not in kept or f"{first.run_id}/reply" not in kept:
        raise Failed(f"run {first.run_id} completed, but its exchange is not in the customer's memory",
                     expected=f"messages {first.run_id}/task and {first.run_id}/reply in MEMORY_FILE, conversation "
                              f"{customer}", seen=f"ids there: {sorted(kept) or 'none'}",
                     look_at=todo(10, "remember the exchange once the run is complete") + "; and "
                             + todo(9, "what a run appends must reach the memory you wrote, or the next draft sees "
                                     "nothing of it"))
    expect_killed(h, h.start(second, crash_at="record_outcome:before"), "as step record_outcome began")
    prompt = h.model.calls(second.task)[0].messages if h.model.calls(second.task) else []
    said = " ".join(str(m.get("content") or "") for m in prompt)
    reply = (h.record(first).result("draft") or {}).get("body", "")
    if first.task not in said or not reply or reply not in said:
        raise Failed(f"the draft of run {second.run_id} was not given the customer's earlier exchange",
                     expected=f"run {first.run_id}'s task and reply among the draft prompt's messages",
                     seen=f"the model got {len(prompt)} message(s): {[m.get('role') for m in prompt]}",
                     look_at=todo(9, "the draft's prompt must be fed from the memory you wrote"))
    h.wipe_memory()
    resume_and_judge(h, second, "record_outcome:before", None)
    expect_done(h, second)
    return (f"run {second.run_id}'s draft got the customer's earlier exchange from memory; memory wiped "
            "between step 2 and step 3, the resume still ran only record_outcome: memory is not the record")


CHECK = Check(4, "bounded memory: the rule after every append; it feeds the prompt and is never the record",
              check_memory)
