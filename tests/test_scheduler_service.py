"""The example scheduler (examples/scheduler) as a real process: slots, bookings and invites applied once
per idempotency key, replays, conflicts, refusals that store nothing, the counts, and a SIGKILL right after
a booking returned, restarted on the same SQLite file."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from examples.scheduler.client import KeyConflict, SchedulerClient, SchedulerRefused, SchedulerUnavailable, applied

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[1]
DAY = "2030-01-07"
READY = "scheduler listening on http://127.0.0.1:"


class Service:
    """The service as a child process on port 0 over ``db``; ``start``, ``kill`` (SIGKILL), ``stop``."""

    def __init__(self, db: Path) -> None:
        self.db, self.port_file = db, db.with_suffix(".port")
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self, timeout: float = 20.0) -> Service:
        self.port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "examples.scheduler.service", "--db", str(self.db), "--port", "0",
             "--port-file", str(self.port_file)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        assert line.startswith(READY), f"no ready line within {timeout} s: {line!r} (exit {self.proc.poll()})"
        self.url = line.strip().removeprefix("scheduler listening on ")
        assert self.port_file.read_text().strip() == self.url.rsplit(":", 1)[1]
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    service = Service(tmp_path / "scheduler.db").start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture
async def scheduler(service: Service) -> AsyncIterator[SchedulerClient]:
    client = SchedulerClient(service.url)
    try:
        yield client
    finally:
        await client.aclose()


def key() -> str:
    return f"test-{uuid.uuid4().hex}"


async def test_slots_listed_and_a_booked_slot_disappears(scheduler: SchedulerClient):
    slots = await scheduler.find_slots(DAY)
    assert len(slots) == 2 * 16
    assert slots[0] == {"room": "atlas", "start": f"{DAY}T09:00", "minutes": 30}
    assert slots[-1] == {"room": "borealis", "start": f"{DAY}T16:30", "minutes": 30}
    await scheduler.book_room(key(), "atlas", f"{DAY}T10:00", 60)
    after = await scheduler.find_slots(DAY)
    gone = [s for s in slots if s not in after]
    assert gone == [{"room": "atlas", "start": f"{DAY}T10:00", "minutes": 30},
                    {"room": "atlas", "start": f"{DAY}T10:30", "minutes": 30}]
    with pytest.raises(SchedulerRefused, match="YYYY-MM-DD") as refused:
        await scheduler.find_slots("07/01/2030")
    assert refused.value.status == 400


async def test_a_booking_applied_once_replayed_and_conflicting(scheduler: SchedulerClient):
    k = key()
    first = await scheduler.book_room(k, "borealis", f"{DAY}T14:00", 90)
    assert first == {"booking_id": first["booking_id"], "room": "borealis", "start": f"{DAY}T14:00",
                     "minutes": 90, "replayed": False}
    assert first["booking_id"].startswith("bk_")
    again = await scheduler.book_room(k, "borealis", f"{DAY}T14:00", 90)
    assert again == {**first, "replayed": True}
    with pytest.raises(KeyConflict, match="was used for another request") as conflict:
        await scheduler.book_room(k, "borealis", f"{DAY}T15:30", 30)
    assert conflict.value.status == 409
    with pytest.raises(KeyConflict):  # the same key on the other endpoint
        await scheduler.send_invite(k, "ana@example.com", "Sync", "Room borealis at 14:00")
    counts = await scheduler.counts()
    assert counts["applied"] == {k: 1}
    assert counts["requests"] == {k: 4}
    # The tools' lookup by key: the applied booking as a replay answers it, each lookup counted; none for a
    # key that applied nothing.
    found = await applied(k, scheduler)
    assert found is not None and found.applied and found.output is not None
    assert (found.output.content, found.output.effect_id, found.output.replayed) == (again, first["booking_id"], True)
    assert await applied(key(), scheduler) is None
    assert (await scheduler.counts())["lookups"][k] == 1


async def test_concurrent_retries_apply_once_and_overlaps_book_once(scheduler: SchedulerClient):
    k = key()
    answers = await asyncio.gather(*(scheduler.book_room(k, "atlas", f"{DAY}T15:00", 30) for _ in range(12)))
    assert [a["replayed"] for a in answers].count(False) == 1
    assert len({a["booking_id"] for a in answers}) == 1
    rivals = await asyncio.gather(*(scheduler.book_room(key(), "borealis", f"{DAY}T12:00", 60) for _ in range(12)),
                                  return_exceptions=True)
    assert sum(isinstance(r, dict) for r in rivals) == 1
    assert all(isinstance(r, dict) or (isinstance(r, SchedulerRefused) and r.status == 422) for r in rivals)
    assert (await scheduler.counts())["requests"][k] == 12


async def test_an_overlap_is_refused_and_nothing_stored(scheduler: SchedulerClient):
    await scheduler.book_room(key(), "atlas", f"{DAY}T11:00", 60)
    k = key()
    with pytest.raises(SchedulerRefused, match="already booked") as refused:
        await scheduler.book_room(k, "atlas", f"{DAY}T11:30", 30)
    assert refused.value.status == 422 and not isinstance(refused.value, KeyConflict)
    assert await scheduler.applied(k) is None
    for room, start, minutes in [("cosmos", f"{DAY}T09:00", 30), ("atlas", f"{DAY}T09:15", 30),
                                 ("atlas", f"{DAY}T08:30", 30), ("atlas", f"{DAY}T16:30", 60),
                                 ("atlas", f"{DAY}T13:00", 45), ("atlas", f"{DAY}T13:00", 270),
                                 ("atlas", "2030-02-30T10:00", 30)]:
        with pytest.raises(SchedulerRefused) as refused:
            await scheduler.book_room(k, room, start, minutes)
        assert refused.value.status == 422, (room, start, minutes)
    assert (await scheduler.counts())["applied"].get(k) is None
    # The key was never applied, so it is still free for a good request.
    assert (await scheduler.book_room(k, "atlas", f"{DAY}T12:00", 30))["replayed"] is False


async def test_an_invite_and_its_effect(scheduler: SchedulerClient):
    k = key()
    sent = await scheduler.send_invite(k, "ana@example.com", "Planning", "Atlas, 10:00, one hour.\nSee you.")
    assert sent["invite_id"].startswith("inv_")
    assert sent == {"invite_id": sent["invite_id"], "to": "ana@example.com", "replayed": False}
    assert await scheduler.applied(k) == {"key": k, "kind": "invite",
                                          "response": {"invite_id": sent["invite_id"], "to": "ana@example.com"}}
    for to, subject, body in [("ana at example.com", "s", "b"), ("a@b@c", "s", "b"), ("ana@example.com", "", "b"),
                              ("ana@example.com", "bell\x07", "b"), ("ana@example.com", "s", "x" * 4001)]:
        with pytest.raises(SchedulerRefused) as refused:
            await scheduler.send_invite(key(), to, subject, body)
        assert refused.value.status == 422


async def test_effects_found_by_key_or_404(scheduler: SchedulerClient):
    k = f"agent/run 7?step=book#{uuid.uuid4().hex[:6]}"  # needs quoting in the path
    booked = await scheduler.book_room(k, "atlas", f"{DAY}T16:00", 60)
    effect = await scheduler.applied(k)
    assert effect is not None and effect["kind"] == "booking"
    assert effect["response"] == {key: value for key, value in booked.items() if key != "replayed"}
    assert await scheduler.applied(key()) is None


async def test_a_booking_survives_a_sigkill_right_after_it_returned(service: Service):
    k = key()
    first = SchedulerClient(service.url)
    try:
        booked = await first.book_room(k, "borealis", f"{DAY}T09:00", 30)
        service.kill()
        with pytest.raises(SchedulerUnavailable):
            await first.counts()
    finally:
        await first.aclose()
    service.start()
    second = SchedulerClient(service.url)
    try:
        effect = await second.applied(k)
        assert effect is not None and effect["response"]["booking_id"] == booked["booking_id"]
        assert {"room": "borealis", "start": f"{DAY}T09:00", "minutes": 30} not in await second.find_slots(DAY)
        assert await second.book_room(k, "borealis", f"{DAY}T09:00", 30) == {**booked, "replayed": True}
        assert (await second.counts())["applied"] == {k: 1}
    finally:
        await second.aclose()


async def test_the_http_edges(service: Service, scheduler: SchedulerClient):
    with pytest.raises(SchedulerRefused, match="Idempotency-Key") as refused:
        await scheduler._call("POST", "/bookings", body={"room": "atlas", "start": f"{DAY}T09:00", "minutes": 30})
    assert refused.value.status == 400
    assert (await scheduler.counts()) == {"applied": {}, "requests": {}, "lookups": {}}
    async with httpx.AsyncClient(base_url=service.url, timeout=10) as http:
        bad_key = await http.post("/bookings", headers={"Idempotency-Key": "x" * 201}, json={})
        assert bad_key.status_code == 400
        malformed = await http.post("/invites", headers={"Idempotency-Key": "k1"}, content=b"{not json")
        assert malformed.status_code == 400 and "JSON" in malformed.json()["error"]
        too_big = await http.post("/invites", headers={"Idempotency-Key": "k2"}, content=b"x" * (64 * 1024 + 1))
        assert too_big.status_code == 413
    async with httpx.AsyncClient(base_url=service.url, timeout=10) as http:
        for method, path in [("GET", "/nowhere"), ("POST", "/nowhere"), ("DELETE", "/bookings"), ("GET", "/")]:
            answer = await http.request(method, path, headers={"Idempotency-Key": "k3"}, json={})
            assert answer.status_code == 404 and "error" in answer.json(), (method, path)


def test_sigterm_stops_it_cleanly(tmp_path: Path):
    service = Service(tmp_path / "other.db").start()
    try:
        assert httpx.get(f"{service.url}/counts", timeout=10).json() == {"applied": {}, "requests": {}, "lookups": {}}
    finally:
        service.stop()
    assert service.proc is not None and service.proc.returncode == 0  # SIGTERM: a clean exit
