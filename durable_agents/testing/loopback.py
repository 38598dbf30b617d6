"""An HTTP server on 127.0.0.1 (a port the OS picks) in a daemon thread of
this process: for stand-ins that a test or the grader runs beside real
processes and reads directly (the grader's model stand-in, the tests' scripted
OpenAI server).

Subclass it with a handler class: ``start()`` (or ``with``) serves,
``stop()`` shuts down and joins, ``url`` is ``http://127.0.0.1:<port>``.
A short poll interval keeps ``stop()``, which waits for one poll, fast.

``JsonHandler`` is the handler plumbing the stand-ins share (the grader's
model, ``durable_agents.testing.standin``): one request per connection, a JSON answer
sent whole or not at all, no access log.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


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


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler that answers with ``_send(status, body)``: ``body`` as JSON, with its length."""

    protocol_version = "HTTP/1.0"  # one request per connection: no idle keep-alive thread outlives a stop

    def _send(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the asker was killed during the request: nobody reads the answer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a stand-in's witness is its counts, not an access log on stderr
