"""worker.py with a workflow cache and a chosen sticky schedule-to-start timeout,
for bench/bench_worker_cache.py: ``python bench/cached_worker.py --sticky-ms 200``.

It runs worker.py itself (as ``__main__``, in this process) with ``--cache
1000``; only ``durable_agents.flowclient.worker_options.CACHED_STICKY_TIMEOUT`` (100 ms as
shipped) is replaced first, so every other option is the shipped one."""

from __future__ import annotations

import runpy
import sys
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from durable_agents.flowclient import worker_options as shipped  # noqa: E402


def main() -> int:
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--sticky-ms":
        print("usage: python bench/cached_worker.py --sticky-ms MS [worker.py options]", file=sys.stderr)
        return 2
    shipped.CACHED_STICKY_TIMEOUT = timedelta(milliseconds=float(argv[1]))
    sys.argv = [str(REPO / "worker.py"), "--cache", "1000", *argv[2:]]
    runpy.run_path(sys.argv[0], run_name="__main__")  # worker.py exits the process itself
    return 0


if __name__ == "__main__":
    sys.exit(main())
