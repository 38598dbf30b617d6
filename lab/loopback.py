"""An HTTP server on 127.0.0.1 (a port the OS picks) in a daemon thread of
this process: for stand-ins that a test or the grader runs beside real
processes and reads directly (the grader's model stand-in, the tests' scripted
OpenAI server).

Subclass it with a handler class: ``start()`` (or ``with``) serves,
``stop()`` shuts down and joins, ``url`` is ``http://127.0.0.1:<port>``.
A short poll interval keeps ``stop()``, which waits for one poll, fast.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class LoopbackServer:
    def __init__(self, handler: type[BaseHTTPRequestHandler], name: str) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name=name, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
