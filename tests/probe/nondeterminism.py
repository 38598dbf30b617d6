"""A probe workflow that tries, one at a time, each thing workflow code must
not do. It lives outside durable_agents/workflows/ but is loaded by the same rules as the
shipped workflow (a module of its own, not passed through), so the sandbox
treats it exactly as it treats durable_agents/workflows/agent_flow.py."""

import datetime
import random
import socket
import sqlite3
import time
import urllib.request
import uuid

from temporalio import workflow

CALLS = {
    "wall clock (datetime.now)": lambda: datetime.datetime.now(),
    "wall clock (time.time)": lambda: time.time(),
    "random.random": lambda: random.random(),
    "uuid.uuid4": lambda: uuid.uuid4(),
    "open": lambda: open(__file__).read(),
    "sqlite3.connect": lambda: sqlite3.connect(":memory:"),
    "network (socket)": lambda: socket.create_connection(("127.0.0.1", 9)),
    "network (urllib)": lambda: urllib.request.urlopen("http://127.0.0.1:9/"),
}


@workflow.defn(name="NondeterminismProbe")
class NondeterminismProbe:
    @workflow.run
    async def run(self, name: str) -> str:
        try:
            CALLS[name]()
        except Exception as err:  # the sandbox's refusal, or what the call did if it was let through
            return f"{type(err).__name__}: {err}"
        return "allowed"
