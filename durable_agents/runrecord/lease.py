"""Lease holder ids, and when a holder is provably dead.

A run's lease (``runs.lease_holder``, ``runs.lease_expires_at``) names the one
process that drives the run. After a SIGKILL nobody hands it back, so on its
own it frees itself only at expiry (10 s by default). This module lets a
resumer on the same host see that the holder is gone and take over at once.

Contract
========

Holder id: ``host:pid:start:random``
    ``host`` is ``socket.gethostname()``; ``pid`` the holder's process id;
    ``start`` the process's start time as the kernel records it (Linux:
    field 22 of ``/proc/<pid>/stat``, ``starttime``, in clock ticks since
    boot), or ``?`` where it cannot be read (no ``/proc``); ``random`` 8 hex
    digits telling apart two holders in one process (two ``Runner`` objects).

``check_holder(holder)`` says the holder is **dead** only when all of:
    - the id has that four-part form with a numeric start time;
    - its host is this host;
    - its pid does not exist, or is a zombie (exited, not yet reaped), or
      runs a process with another start time (the pid was reused).
    Anything else is **not presumed dead**, and the lease is waited out
    until it expires: a holder on another host (its pids are not ours to
    look at), an id in the older ``host:pid:random`` form, a ``?`` start
    time, or a live pid whose start time cannot be read now (permissions,
    no ``/proc``). Every doubt falls on the side of waiting.

Why the start time: pids are reused. A dead holder's pid may by now belong to
an unrelated process; by the pid alone the holder would look alive, and the
resumer would wait for the expiry for nothing. The pair (pid, start time)
names one process for the life of the boot.

"This host" means one pid namespace: two containers that share a record file
(and a file system that honours SQLite's locks) must have distinct host
names, as Docker and Kubernetes give them by default; with one shared name
each would see the other's pids as missing and take over a live holder.

Why this is liveness, not a fence
=================================

The lease keeps two processes from *driving* one run; it does not stop a
stale process from *acting*. A holder that is paused (SIGSTOP, a VM freeze, a
long GC) outlives its lease without knowing it; when it wakes, a request it
had in flight can reach the provider after the new holder's. What keeps that
to one effect is the idempotency key (``durable_agents.steps.keys``): both send the same
key, and the provider applies it once. What keeps the stale process from
overwriting the record is that every write of the runner carries ``WHERE
lease_holder = me`` and stops it when that matches nothing (``LeaseLost``).
Taking over early from a *dead* local holder changes neither: a dead process
starts nothing more, and a request it had already written to its socket may
still arrive after the takeover, a repeat like any other that the key makes
harmless.
"""

from __future__ import annotations

import os
import re
import secrets
import socket
from dataclasses import dataclass

UNKNOWN_START = "?"
_NUMBER = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Holder:
    """A parsed four-part holder id. ``start`` is None when recorded as unknown."""

    host: str
    pid: int
    start: int | None
    token: str


@dataclass(frozen=True)
class Verdict:
    """Whether ``holder`` is provably dead, and why (words for the user)."""

    holder: str
    dead: bool
    reason: str


def _read_stat(pid: int) -> tuple[str, int] | None:
    """(state, starttime) from /proc/<pid>/stat; None if unreadable or malformed."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return parse_stat(f.read())
    except OSError:
        return None


def parse_stat(data: bytes) -> tuple[str, int] | None:
    """(state, starttime): fields 3 and 22 of a ``/proc/<pid>/stat`` line; None if malformed.

    The second field, the command name, is in parentheses and may itself hold
    spaces and parentheses, so the fields are counted from the *last* ``)``.
    """
    end = data.rfind(b")")
    if end < 0:
        return None
    rest = data[end + 1 :].split()  # rest[0] is field 3 (state), so field 22 is rest[19]
    try:
        return rest[0].decode("ascii", "replace"), int(rest[19])
    except (IndexError, ValueError):
        return None


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), or None if it cannot be read."""
    stat = _read_stat(pid)
    return None if stat is None else stat[1]


def new_holder_id() -> str:
    """``host:pid:start:random`` for this process (see the module docstring)."""
    pid = os.getpid()
    start = process_start_time(pid)
    return f"{socket.gethostname()}:{pid}:{UNKNOWN_START if start is None else start}:{secrets.token_hex(4)}"


def parse_holder(holder: str) -> Holder | None:
    """The four parts of a holder id, or None for any other form (the older three-part one included)."""
    parts = holder.rsplit(":", 3)
    if len(parts) != 4:
        return None
    host, pid, start, token = parts
    if not host or not _NUMBER.fullmatch(pid) or int(pid) <= 0 or not token:
        return None
    if start == UNKNOWN_START:
        return Holder(host, int(pid), None, token)
    if not _NUMBER.fullmatch(start):
        return None
    return Holder(host, int(pid), int(start), token)


def _pid_exists(pid: int) -> bool | None:
    """True / False, or None when the system will not say."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    except OSError:
        return None
    return True


def check_holder(holder: str, *, host: str | None = None) -> Verdict:
    """Is ``holder`` provably dead? Only for a holder on this host (see the contract above)."""
    here = socket.gethostname() if host is None else host
    parsed = parse_holder(holder)
    if parsed is None:
        return Verdict(holder, False, "its id has no process start time (written by an older version), "
                                      "so it cannot be checked")
    if parsed.host != here:
        return Verdict(holder, False, f"it runs on host {parsed.host}, which cannot be checked from {here}")
    if parsed.start is None:
        return Verdict(holder, False, "its process start time was not recorded, so it cannot be checked")
    pid = parsed.pid
    exists = _pid_exists(pid)
    if exists is False:
        return Verdict(holder, True, f"its process (pid {pid}) is gone")
    stat = _read_stat(pid)
    if stat is None:
        if _pid_exists(pid) is False:  # it exited between the two looks
            return Verdict(holder, True, f"its process (pid {pid}) is gone")
        return Verdict(holder, False, f"pid {pid} exists but its start time cannot be read")
    state, start = stat
    if start != parsed.start:
        return Verdict(holder, True, f"pid {pid} now belongs to another process (started at tick {start}, "
                                     f"not {parsed.start})")
    if state in ("Z", "X"):
        return Verdict(holder, True, f"its process (pid {pid}) has exited and awaits its parent")
    return Verdict(holder, False, f"its process (pid {pid} on this host) is alive")


def holder_is_dead(holder: str) -> bool:
    return check_holder(holder).dead


__all__ = ["Holder", "Verdict", "check_holder", "holder_is_dead", "new_holder_id", "parse_holder",
           "parse_stat", "process_start_time"]
