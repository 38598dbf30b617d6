"""Record replay fixtures: real histories of the agent flow, made by the code
checked out now, for the replay test to run under every later version.

    .venv/bin/python -m tests.record_histories [--out tests/data/histories/<commit>]

Run it on main *before* a change to workflow code, activity names or inputs,
or the codec, and commit what it writes: those histories are what runs in
flight look like to the new code. Never regenerate a directory that is
already committed; record a new one instead (the replay test reads them all).

It starts its own dev server (in memory), provider and worker processes, and
records, each as ``<scenario>.json`` (the format of ``temporal workflow show
--output json``, readable by ``WorkflowHistory.from_json``):

=====================  =========================================================
completed              a run that completed, no faults
completed-encrypted    the same with the payload codec on (key in ``FIXTURE_KEY``)
in-flight              a worker killed before step 3; history read while open
in-flight-encrypted    the same, encrypted
retried                step 2 answered 503 twice by the provider, then completed
failed-rejected        step 2 refused for good (the .invalid domain): FAILED
failed-exhausted       step 3 answered 503 until the retries ran out: FAILED
=====================  =========================================================
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import re
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from flowclient.connect import connect
from flowclient.runs import start_run
from flowclient.status import run_status
from lab.processes import LAB_SERVER_CONFIG, REPO, DevServer, start_worker, wait_until
from lab.provider_process import start_provider
from providerclient import ProviderClient

# Not a secret: it exists so the encrypted fixtures can be decoded by the tests.
FIXTURE_KEY = base64.b64encode(bytes(range(200, 232))).decode()
FIXTURE_KEY_ID = "fixture-key"
TASK = "Confirm the refund for order 1234"
EMAIL = "ada@example.com"


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, text=True,
                          capture_output=True, check=True).stdout.strip()


async def _closed(client, run_id: str, timeout: float = 120.0) -> dict:
    async def check():
        status = await run_status(client, run_id)
        return status if status["status"] != "running" else None

    return await wait_until(check, timeout, f"run {run_id} to close", interval=0.2)


_ABSOLUTE_FILE = re.compile(r'File \\?"(/[^"\\]*)')


def without_machine_paths(text: str) -> str:
    """``text`` with the recording machine's paths cut from the stack traces of
    failures: a file of the project relative to its root, an installed one from
    ``site-packages/``, anything else by its name. Replay never reads a stack
    trace, so the fixture replays the same; the repository holds no machine path."""
    def cut(match: re.Match[str]) -> str:
        path = match.group(1)
        if "/site-packages/" in path:
            short = "site-packages/" + path.split("/site-packages/", 1)[1]
        elif path.startswith(f"{REPO}/"):
            short = path[len(f"{REPO}/"):]
        else:
            short = path.rsplit("/", 1)[-1]
        return match.group(0)[: match.start(1) - match.start(0)] + short

    return _ABSOLUTE_FILE.sub(cut, text)


async def _write(client, run_id: str, path: Path) -> None:
    history = await client.get_workflow_handle(run_id).fetch_history()
    # Ids and times are kept as recorded; the task queue is the recording's own.
    path.write_text(without_machine_paths(json.dumps(history.to_json_dict(), indent=2)) + "\n")


async def record(out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        server = DevServer(dynamic_config=LAB_SERVER_CONFIG).start()
        provider_proc = start_provider(tmp_path / "provider.db")
        provider_url = provider_proc.url
        procs = []
        try:
            for encrypted in (False, True):
                env = {"MEMORY_DB": str(tmp_path / "memory.db")}
                if encrypted:
                    env.update(LAB_CODEC_KEY=FIXTURE_KEY, LAB_CODEC_KEY_ID=FIXTURE_KEY_ID)
                client = await connect({"TEMPORAL_ADDRESS": server.address, **env})
                suffix = "-encrypted" if encrypted else ""
                queue = f"fixtures-{uuid.uuid4().hex[:8]}"

                # In flight: killed before step 3, read while no worker runs it.
                dying = start_worker(server.address, provider_url, queue,
                                     {**env, "CRASH_AT": "record_outcome:before"}, name="dying")
                procs.append(dying)
                run_id = f"in-flight{suffix}"
                await start_run(client, run_id, TASK, EMAIL, queue=queue)
                await wait_until(lambda dying=dying: not dying.alive(), 60,
                                 "the worker to die at record_outcome:before")
                await _write(client, run_id, out / f"{run_id}.json")
                written.append(run_id)

                worker = start_worker(server.address, provider_url, queue, env)
                procs.append(worker)
                await _closed(client, run_id)
                run_id = f"completed{suffix}"
                await start_run(client, run_id, TASK, EMAIL, queue=queue)
                await _closed(client, run_id)
                await _write(client, run_id, out / f"{run_id}.json")
                written.append(run_id)
                if encrypted:
                    continue

                async with ProviderClient(provider_url) as provider:
                    await provider.set_faults(fail_next=2, status=503, kinds=["email"])
                    await start_run(client, "retried", TASK, EMAIL, queue=queue)
                    await _closed(client, "retried")
                    await _write(client, "retried", out / "retried.json")
                    written.append("retried")

                    await start_run(client, "failed-rejected", TASK, "nobody@mailbox.invalid", queue=queue)
                    await _closed(client, "failed-rejected")
                    await _write(client, "failed-rejected", out / "failed-rejected.json")
                    written.append("failed-rejected")

                    await provider.set_faults(fail_next=1000, status=503, kinds=["ticket"])
                    await start_run(client, "failed-exhausted", TASK, EMAIL, queue=queue)
                    await _closed(client, "failed-exhausted")
                    await provider.clear_faults()
                    await _write(client, "failed-exhausted", out / "failed-exhausted.json")
                    written.append("failed-exhausted")
        finally:
            for proc in procs:
                proc.kill()
            provider_proc.stop()
            server.stop()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="default: tests/data/histories/<commit of HEAD>")
    args = parser.parse_args(argv)
    out = args.out or REPO / "tests" / "data" / "histories" / _commit()
    if out.exists() and any(out.iterdir()):
        print(f"{out} exists: fixtures are never regenerated; record into a new directory", file=sys.stderr)
        return 2
    written = asyncio.run(record(out))
    print(f"recorded {len(written)} histories in {out}: {', '.join(written)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
