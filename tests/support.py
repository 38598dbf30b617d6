"""Helpers the test modules share, written once: no test module imports from
another. Fixtures stay in tests/conftest.py; this module holds plain functions
and constants, importable from any test (``from tests.support import ...``).

Every wait polls with a deadline and fails with what it saw last: no fixed
sleeps. Counts of effects come from the provider, the judge of "exactly once".
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType

from durable_agents.flowclient.runs import wait_for_status
from durable_agents.flowclient.status import failure_text
from durable_agents.providerclient import EffectRecord, fetch_effects
from durable_agents.runrecord import DEFAULT_FLOW, RunRecord
from durable_agents.runrecord.store import NextAttempt
from durable_agents.steps.keys import idempotency_key
from durable_agents.steps.startedline import started_steps
from lab.processes import REPO, Proc, wait_until

T = TypeVar("T")

# -- inputs ----------------------------------------------------------------------

TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"

# Bad input and the words every engine's CLI must answer it with (starter.py
# in tests/test_flow.py, python -m durable_agents.runrecord in tests/test_runrecord.py).
BAD_INPUT_CASES = [
    (["start", "r-1", "", "--email", EMAIL], "task is empty"),
    (["start", "r-1", "x" * 4001, "--email", EMAIL], "limit is 4000"),
    (["start", "r-1", TASK, "--email", "not-an-address"], "malformed"),
    (["start", "r-1", TASK, "--email", "a@example.com\r\nBcc: x@example.com"], "single line"),
    (["start", "bad id", TASK, "--email", EMAIL], "run id"),
    # The text rule (README, input limits): the field, the character and where it is.
    (["start", "r-1", "Refund \x1b[2J\x1b]0;owned\x07 order 42", "--email", EMAIL],
     "task holds U+001B (ESC) at position 8"),
    (["start", "r-1", TASK, "--email", "ada\t@example.com"], "email address holds U+0009 (TAB) at position 4"),
    (["start", "r-1", TASK, "--email", EMAIL, "--conversation", "c\u202e1"],
     "conversation id holds U+202E (RIGHT-TO-LEFT OVERRIDE) at position 2"),
    (["status", "no-such-run-anywhere"], "no run with id"),
]

# -- waiting ---------------------------------------------------------------------


async def poll_until(check, timeout: float = 30.0, interval: float = 0.1, what: str = "condition"):
    """Call ``check`` (sync or async) until it returns a truthy value; fail with the last value seen."""
    return await wait_until(check, timeout, what, interval, error=AssertionError)


def poll_until_sync(check: Callable[[], T | None], *, timeout: float, describe: Callable[[], str],
                    interval: float = 0.05) -> T:
    """``poll_until`` for code without an event loop; ``describe`` says what was seen on failure."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up after {timeout:g}s; last seen: {describe()}")
        time.sleep(interval)


def wait_exit(proc: Proc, timeout: float = 30.0) -> int:
    """The process's exit code, once it has exited and its output is read (``Proc.wait``); past ``timeout``,
    ``ProcessTimeout`` with what it printed last (the fixture that started it kills it)."""
    return proc.wait(timeout)


def finished(proc: Proc, timeout: float = 60.0) -> int:
    """``wait_exit`` with a runner's longer deadline: a whole run, not one command."""
    return wait_exit(proc, timeout)


async def wait_closed(client, run_id: str, timeout: float = 90.0) -> dict:
    """The Temporal run's status (durable_agents.flowclient.status) once it is no longer running: what the Temporal
    driver (``lab.engines.TemporalDriver.settle``) waits for, for tests that hold a client rather than a driver."""
    return await wait_for_status(client, run_id, lambda s: s["status"] != "running", poll=0.1, timeout=timeout)


# -- counting --------------------------------------------------------------------


def executions(proc_or_text: Proc | str, step: str) -> int:
    """How many times a process began executing ``step``: every engine prints its started line
    (``durable_agents.steps.startedline``) once per execution. Takes the process or text already read from one."""
    text = proc_or_text if isinstance(proc_or_text, str) else proc_or_text.output()
    return started_steps(text).count(step)


def effects_by_key(provider_url: str, run_id: str) -> dict[str, EffectRecord]:
    """The provider's bookkeeping for one run, by idempotency key."""
    return {e.key: e for e in fetch_effects(provider_url, run_id=run_id)}


def counts(provider_url: str, run_id: str, step: str) -> tuple[int, int] | None:
    """(requests, effects applied) under ``step``'s key at the provider; None if no request carried it."""
    e = effects_by_key(provider_url, run_id).get(idempotency_key(run_id, step))
    return None if e is None else (e.requests, e.effects_applied)


# -- the run record --------------------------------------------------------------


def status_json(runrecord, run_id: str) -> dict:
    """``python -m durable_agents.runrecord status RUN_ID --json``, through the ``runrecord`` fixture."""
    proc = runrecord("status", run_id, "--json")
    finished(proc)
    return json.loads(proc.output())


def lease_expired(db, run_id: str) -> bool:
    with RunRecord(db) as record:
        run = record.load(run_id)
        return run.lease_holder is None or run.lease_expires_at < time.time()


async def wait_lease_expired(db, run_id: str, timeout: float = 15.0) -> None:
    await poll_until(lambda: lease_expired(db, run_id), timeout=timeout, interval=0.05,
                     what=f"the crashed runner's lease on {run_id} to expire")


def create_unleased(db, run_id: str, email: str = EMAIL) -> None:
    """A run recorded as started (draft attempt 1) whose runner is gone and lease released."""
    with RunRecord(db) as record:
        record.create_run(run_id, TASK, email, run_id, [s.name for s in DEFAULT_FLOW], "test:0:setup", 60,
                          NextAttempt(0, 1, None))
        record.release_lease(run_id, "test:0:setup")


# -- Temporal histories ----------------------------------------------------------


def payloads_in(message, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, Payload) for every Payload anywhere inside a protobuf message."""
    for field, value in message.ListFields():
        if field.type != field.TYPE_MESSAGE:
            continue
        if field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].type != field.TYPE_MESSAGE:
                continue
            items = [(f"{path}/{field.name}[{key}]", item) for key, item in value.items()]
        elif isinstance(value, Sequence):
            items = [(f"{path}/{field.name}[{n}]", item) for n, item in enumerate(value)]
        else:
            items = [(f"{path}/{field.name}", value)]
        for item_path, item in items:
            if item.DESCRIPTOR.full_name == Payload.DESCRIPTOR.full_name:
                yield item_path, item
            else:
                yield from payloads_in(item, item_path)


async def first_workflow_task_failure(raw_client, reader, run_id: str) -> str:
    """The decoded message of the run's first failed workflow task, once there is one."""
    async def failed():
        history = await raw_client.get_workflow_handle(run_id).fetch_history()
        return next((ev.workflow_task_failed_event_attributes.failure for ev in history.events
                     if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED), None)

    failure = await poll_until(failed, timeout=60, what=f"a failed workflow task in {run_id}")
    return await failure_text(reader, failure)


# -- listening sockets (Linux /proc) ---------------------------------------------


def activity_ids(events) -> dict[int, str]:
    """Activity id (``<step>/<attempt>``, a loop's ``turn-2/call-0/<attempt>``) by the event id of its
    ActivityTaskScheduled."""
    return {e.event_id: e.activity_task_scheduled_event_attributes.activity_id for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED}


def started_by(events) -> dict[str, str]:
    """The identity of the worker that took each activity attempt (activity id -> identity)."""
    scheduled = activity_ids(events)
    return {scheduled[e.activity_task_started_event_attributes.scheduled_event_id]:
            e.activity_task_started_event_attributes.identity
            for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED}


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def _process_tree(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        p = todo.pop()
        found.add(p)
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            children = []
        todo += [int(c) for c in children]
    return found


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state held by pid or its children."""
    inodes = set().union(*(_socket_inodes(p) for p in _process_tree(pid)))
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A = LISTEN
                continue
            hex_addr, hex_port = local.split(":")
            raw = bytes.fromhex(hex_addr)
            # /proc stores each 32-bit word in host (little-endian) order.
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            addr = ipaddress.ip_address(words)
            found.append((str(addr), int(hex_port, 16)))
    return found


def is_loopback(address: str) -> bool:
    """True for a loopback address, an IPv4-mapped IPv6 one included."""
    ip = ipaddress.ip_address(address)
    if ip.version == 6 and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return ip.is_loopback


# -- the provider contract (docs/provider-contract.md) ----------------------------

CONTRACT = REPO / "docs" / "provider-contract.md"


@dataclass(frozen=True)
class Limit:
    """One row of the contract's table of limits."""

    row: str
    field: str
    limit: int | None  # None for a rule without a number
    rule: str
    provider: str  # the provider's constant (provider.validation), "rule" or "no"
    status: int | None  # what the provider answers past the limit; None: accepted
    error: str | None
    client: str  # the client's constant (durable_agents.steps.limits), "rule" or "no"


def _cell(text: str) -> str:
    return text.strip().strip("`").strip()


def contract_limits(path: Path = CONTRACT) -> dict[str, Limit]:
    """The table under "## Limits" in the contract, by row id. Fails loudly on
    a table it cannot read, so a malformed edit is a failing test, not a
    silently shorter table."""
    section = path.read_text().split("\n## Limits\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["Row", "Field", "Limit", "Rule", "Provider", "Provider answer", "Client"], header
    rows: dict[str, Limit] = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == len(header), f"{path.name}: a row of the limits table has {len(cells)} cells: {line}"
        row, field, limit, rule, provider, answer, client = cells
        if answer == "accepted":
            status, error = None, None
        else:
            found = re.fullmatch(r"(\d{3}) `(\w+)`", answer)
            assert found, f"{path.name}: row {row}: provider answer {answer!r} is not like 422 `invalid_request`"
            status, error = int(found[1]), found[2]
        rows[_cell(row)] = Limit(
            row=_cell(row), field=field, limit=None if limit == "-" else int(limit.replace(",", "")), rule=rule,
            provider=_cell(provider), status=status, error=error, client=_cell(client),
        )
    return rows


# Samples both sides' contract tests send: what the text rules and the address
# format refuse, and text they must let through.
NOT_SINGLE_LINE = ("a\tb", "a\nb", "a\r\nb", "a\x00b", "a\x1b[31mb", "a\x7fb", "a\x9bb", "a\u2028b", "a\u202eb",
                   "a\u2066b")
"""Each holds a character single-line text refuses: tab, line breaks, NUL, ESC, DEL, a C1 control (CSI),
a Unicode line separator, a bidirectional override and isolate."""
NOT_MULTILINE = ("Hi\rthere", "a\x00b", "a\x0bb", "a\x1b[2Jb", "a\x7fb", "a\x85b", "a\u202eb")
"""Each holds a character multi-line text refuses (a lone CR among them)."""
MULTILINE_OK = ("Hi\r\n\tthere\n", "Hi\n\n-- \nSupport\u2028team")
TEXT_OK = " \u00e9\u4e2d\u200d"
"""Not control characters: accented and CJK letters, a zero-width joiner."""
ADDRESSES_OK = ("ada@example.com", "o'brien+tag@mail.example.co.uk")
ADDRESSES_MALFORMED = ("ada@example", "ada example@example.com", "<ada@example.com>", "ada@@example.com",
                       '"ada"@example.com', "ada@-example.com")


# -- pages -------------------------------------------------------------------------


@dataclass
class Node:
    """An element of a parsed page: enough of a DOM to assert on what a page shows."""

    tag: str
    attrs: dict[str, str]
    children: list[Node | str]

    def text(self) -> str:
        """The text a reader sees in it (entities decoded), without markup."""
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def all(self, tag: str | None = None, cls: str | None = None, **attrs: str) -> list[Node]:
        """Every element below this one with that tag, class and attribute values (``data_x`` is ``data-x``)."""
        wanted = {k.replace("_", "-"): v for k, v in attrs.items()}
        found = []
        for child in self.children:
            if isinstance(child, str):
                continue
            if ((tag is None or child.tag == tag) and (cls is None or cls in child.classes)
                    and all(child.attrs.get(k) == v for k, v in wanted.items())):
                found.append(child)
            found.extend(child.all(tag, cls, **attrs))
        return found


def parse_page(markup: str) -> Node:
    """A page (served HTML, or Chromium's ``--dump-dom``) as a tree of ``Node``. Void elements close
    themselves; the tree is as forgiving as the markup these pages produce needs, no more."""
    from html.parser import HTMLParser

    void = {"meta", "br", "hr", "img", "input", "link", "source", "wbr", "col", "area", "base"}
    root = Node("#document", {}, [])
    stack = [root]

    class Builder(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            node = Node(tag, {k: v or "" for k, v in attrs}, [])
            stack[-1].children.append(node)
            if tag not in void:
                stack.append(node)

        def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            stack[-1].children.append(Node(tag, {k: v or "" for k, v in attrs}, []))

        def handle_endtag(self, tag: str) -> None:
            for depth in range(len(stack) - 1, 0, -1):
                if stack[depth].tag == tag:
                    del stack[depth:]
                    return

        def handle_data(self, data: str) -> None:
            stack[-1].children.append(data)

    builder = Builder(convert_charrefs=True)
    builder.feed(markup)
    builder.close()
    return root


# ---------------------------------------------------------------- another commit's code, as a git worktree


def git(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@contextmanager
def worktree_of(commit: str, where: Path, what: str) -> Iterator[Path]:
    """A git worktree of ``commit`` at ``where`` for the block, removed after (pass or fail).

    Skips the test, saying it needs ``what`` (e.g. "the code before issue 35"), where git is
    missing, this is no git checkout, or the clone lacks the commit (a shallow clone)."""
    if shutil.which("git") is None:
        pytest.skip(f"git is not installed: this test checks out {what} as a git worktree")
    if git("rev-parse", "--is-inside-work-tree").returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: this test checks out {what} from its history")
    if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        pytest.skip(f"commit {commit[:12]} ({what}) is not in this clone, a shallow one? "
                    "`git fetch --unshallow` brings it")
    added = git("worktree", "add", "--detach", str(where), commit)
    assert added.returncode == 0, f"git worktree add failed:\n{added.stderr}"
    try:
        yield where
    finally:
        if git("worktree", "remove", "--force", str(where)).returncode != 0:
            # Gone already, or git refused: leave no registration behind.
            shutil.rmtree(where, ignore_errors=True)
            git("worktree", "prune")
