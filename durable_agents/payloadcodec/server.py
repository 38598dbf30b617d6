"""A codec server for the Temporal UI and CLI: decrypts (and encrypts) payloads
with the lab's codec (``payloadcodec``), so the UI shows what a run
carries instead of ciphertext.

    python -m durable_agents.payloadcodec.server [--host 127.0.0.1] [--port 8081] [--origin URL ...] [--verbose]

The keys come from the same environment as the worker's and the starter's
(``LAB_CODEC_KEY``, ``LAB_CODEC_KEY_ID``, ``LAB_CODEC_DECRYPT_ONLY_KEYS``); it
refuses to start without them.

Protocol (Temporal's codec server protocol, as the UI and ``temporal ...
--codec-endpoint`` speak it):

- ``POST .../decode`` and ``POST .../encode``; only the last path segment
  counts, so ``/decode`` and ``/default/decode`` (the CLI's ``{namespace}``
  template) are the same endpoint. The body is ``{"payloads": [...]}``, each
  payload in protobuf JSON (metadata values and data in base64); the answer
  has the same shape. Clients send ``X-Namespace`` (logged with
  ``--verbose``, not used: one set of keys serves every namespace).
- Decode opens every payload the keys allow and returns payloads that are not
  encrypted as they are (the UI sends every payload of a history; the patch
  marker, or a run recorded before encryption, is shown, not refused: the
  server only displays, while the workers refuse plaintext). The UI does not
  say which run a payload belongs to, so the run binding is authenticated
  (an altered workflow id fails) but not compared with the page.
- Encode seals payloads typed into the UI or the CLI; there is no run to
  bind them to, so they are written in the unbound format, which workers read.
- A request whose ``Origin`` is not allowed is refused (403); allowed origins
  get CORS headers, and ``OPTIONS`` preflights are answered (methods POST,
  headers Content-Type, X-Namespace, Authorization; credentials allowed, for
  the UI's "include cross-origin credentials"). Allowed origins: ``--origin``
  (repeatable), else ``LAB_CODEC_SERVER_ORIGINS`` (comma-separated), else the
  dev server's UI: http://localhost:8233 and http://127.0.0.1:8233.
- Errors are JSON ``{"error": code, "message": text}`` saying what to send
  instead: 400 (not JSON, not payloads, a payload that does not decrypt, a
  body nested more than ``MAX_JSON_DEPTH`` arrays and objects deep: code
  ``too_deep``, naming the limit), 403, 404, 405, 411, 413. No message
  carries key material.

Authentication, optional: with ``LAB_CODEC_SERVER_TOKEN`` set, ``/decode``
and ``/encode`` answer only requests carrying ``Authorization: Bearer
<token>`` (401 otherwise; CORS preflights, which browsers send without
credentials, are answered either way). The CLI sends it with ``temporal ...
--codec-auth "Bearer <token>"``; the Temporal UI forwards its user's access
token when "pass access token" is on, so behind a UI with single sign-on the
token is that one, checked by a proxy in front (the dev server's UI has no
login and sends none: leave the token unset there). Without a token anyone who
can reach the port can have payloads decrypted, which is why it listens on
loopback only, unless ``LAB_CODEC_SERVER_ALLOW_REMOTE=1`` says the network is
private (the same rule as the provider's). The token is compared in constant
time and never logged. Prints ``codec server listening on http://HOST:PORT``
once it accepts requests.
"""

from __future__ import annotations

import argparse
import hmac
import ipaddress
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format
from temporalio.api.common.v1 import Payloads

from durable_agents.payloadcodec import AesGcmCodec, CodecConfigError, codec_from_env

DEFAULT_PORT = 8081
DEFAULT_ORIGINS = ("http://localhost:8233", "http://127.0.0.1:8233")
ORIGINS_VARIABLE = "LAB_CODEC_SERVER_ORIGINS"
ALLOW_REMOTE_VARIABLE = "LAB_CODEC_SERVER_ALLOW_REMOTE"
TOKEN_VARIABLE = "LAB_CODEC_SERVER_TOKEN"
ALLOWED_HEADERS = "Content-Type, X-Namespace, Authorization"
MAX_BODY_BYTES = 16 * 1024 * 1024  # a history's payloads; Temporal caps each at 2 MB
MAX_JSON_DEPTH = 32  # arrays and objects inside one another; {"payloads": [{"metadata": {...}}]} needs 3
_ENDPOINTS = ("decode", "encode")
_USAGE = ('send {"payloads": [...]}, each payload as protobuf JSON: '
          '{"metadata": {"encoding": "<base64>"}, "data": "<base64>"}')


class BadRequest(ValueError):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def normalise_origin(value: str) -> str:
    """``scheme://host[:port]``, lower case, or ValueError saying what an origin is."""
    text = value.strip().rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query:
        raise ValueError(f"{value!r} is not an origin: give scheme://host[:port], e.g. http://localhost:8233")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{value!r} has a bad port") from None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def origins_from(args: Sequence[str] | None, env: Mapping[str, str]) -> list[str]:
    raw = list(args or []) or [o for o in (env.get(ORIGINS_VARIABLE) or "").split(",") if o.strip()]
    return [normalise_origin(o) for o in (raw or DEFAULT_ORIGINS)]


def is_loopback(host: str) -> bool:
    """The provider's rule (provider/server.py): an address, or a name all of whose addresses are loopback."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


# A whole JSON string (so the brackets in it are text), an opening bracket (group 1) or a closing one.
_STRING_OR_BRACKET = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|([\[{])|[\]}]')


def refuse_deep_json(body: bytes) -> None:
    """BadRequest if ``body`` nests arrays and objects past ``MAX_JSON_DEPTH``.

    Counted in one pass over the bytes, before any parser sees them: Python's
    JSON parser recurses once per level (and protobuf's ParseDict again), so a
    few thousand brackets exhaust the stack, and the request handler dies
    without an answer. (The provider has its own check: it shares no code.)"""
    depth = 0
    for token in _STRING_OR_BRACKET.finditer(body):
        if token.group(1):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise BadRequest(400, "too_deep", f"the body nests arrays and objects more than {MAX_JSON_DEPTH} "
                                                  f"deep; the limit is {MAX_JSON_DEPTH} levels: {_USAGE}")
        elif not token.group().startswith(b'"'):
            depth -= 1


def transform(codec: AesGcmCodec, endpoint: str, body: bytes) -> dict[str, Any]:
    """The answer to one request body, or BadRequest."""
    refuse_deep_json(body)
    try:
        document = json.loads(body)
    except ValueError as err:
        raise BadRequest(400, "invalid_json", f"the body is not JSON ({err}): {_USAGE}") from None
    if not isinstance(document, dict) or not isinstance(document.get("payloads"), list):
        raise BadRequest(400, "invalid_payloads", f"the body has no \"payloads\" list: {_USAGE}")
    try:
        payloads = json_format.ParseDict(document, Payloads(), ignore_unknown_fields=True).payloads
    except json_format.ParseError as err:
        # The parser's message can quote the offending value: cut it short.
        raise BadRequest(400, "invalid_payloads",
                         f"payloads are not protobuf JSON ({str(err)[:200]}): {_USAGE}") from None
    out = []
    for n, payload in enumerate(payloads, 1):
        try:
            # The server displays: plaintext is shown as it is, whatever the workers' policy.
            out.append(codec.encrypt(payload) if endpoint == "encode" else codec.decrypt(payload, allow_plaintext=True))
        except ValueError as err:  # UnknownKeyError, DecryptionError: they name ids, never keys
            raise BadRequest(400, f"{endpoint}_failed", f"payload {n}: {err}") from None
    return json_format.MessageToDict(Payloads(payloads=out))


class CodecServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], family: int, codec: AesGcmCodec,
                 origins: Sequence[str], verbose: bool = False, token: str | None = None) -> None:
        self.address_family = family
        self.codec = codec
        self.token = token
        self.origins = frozenset(origins)
        self.verbose = verbose
        super().__init__(address, Handler)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "lab-codec-server"
    sys_version = ""
    server: CodecServer

    # -- plumbing --------------------------------------------------------------

    def _endpoint(self) -> str | None:
        last = urlsplit(self.path).path.rstrip("/").rsplit("/", 1)[-1]
        return last if last in _ENDPOINTS else None

    def _origin_allowed(self) -> bool | None:
        """None: no Origin header (the CLI, curl); else whether it is allowed."""
        origin = self.headers.get("Origin")
        if origin is None:
            return None
        try:
            return normalise_origin(origin) in self.server.origins
        except ValueError:
            return False

    def _send(self, status: int, body: dict[str, Any] | None, extra: Mapping[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self._origin_allowed():
            self.send_header("Access-Control-Allow-Origin", self.headers["Origin"])
            self.send_header("Access-Control-Allow-Credentials", "true")
        self.send_header("Vary", "Origin")
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if data and self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str, extra: Mapping[str, str] | None = None) -> None:
        self._send(status, {"error": code, "message": message}, extra)

    def _refuse_origin(self) -> bool:
        if self._origin_allowed() is False:
            self._error(403, "origin_not_allowed",
                        f"origin {self.headers['Origin']!r} may not use this codec server: start it with "
                        f"--origin {self.headers['Origin']} (or add it to {ORIGINS_VARIABLE})")
            return True
        return False

    def _refuse_unauthenticated(self) -> bool:
        token = self.server.token
        if not token:
            return False
        given = self.headers.get("Authorization") or ""
        scheme, _, value = given.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode()):
            return False
        self._error(401, "unauthorized",
                    "this codec server needs Authorization: Bearer <token> (the value of "
                    f"{TOKEN_VARIABLE}; with the CLI: --codec-auth \"Bearer <token>\")",
                    {"WWW-Authenticate": 'Bearer realm="codec"'})
        return True

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            sys.stderr.write(f"codec server: {self.address_string()} {format % args}\n")

    # -- methods ---------------------------------------------------------------

    def do_OPTIONS(self) -> None:  # CORS preflight
        if self._endpoint() is None:
            return self._error(404, "not_found", "the endpoints are POST /decode and POST /encode")
        if self._refuse_origin():
            return
        extra = {"Access-Control-Allow-Methods": "POST, OPTIONS",
                 "Access-Control-Allow-Headers": ALLOWED_HEADERS,
                 "Access-Control-Max-Age": "600"}
        if self.headers.get("Access-Control-Request-Private-Network") == "true" and self._origin_allowed():
            extra["Access-Control-Allow-Private-Network"] = "true"  # a public UI calling a local server
        self._send(204, None, extra)

    def do_POST(self) -> None:
        started = time.monotonic()
        endpoint = self._endpoint()
        if endpoint is None:
            self._drain()
            return self._error(404, "not_found", "the endpoints are POST /decode and POST /encode")
        if self._refuse_origin() or self._refuse_unauthenticated():
            self._drain()
            return
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            return self._error(411, "length_required", f"send a Content-Length header; {_USAGE}")
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            return self._error(413, "payload_too_large",
                               f"the body is {length} bytes; at most {MAX_BODY_BYTES} are accepted: "
                               "send fewer payloads")
        body = self.rfile.read(int(length))
        try:
            answer = transform(self.server.codec, endpoint, body)
        except BadRequest as err:
            return self._error(err.status, err.code, str(err))
        self._send(200, answer)
        if self.server.verbose:
            sys.stderr.write(
                f"codec server: {endpoint} {len(answer.get('payloads', []))} payload(s), namespace "
                f"{self.headers.get('X-Namespace') or '-'}, {1000 * (time.monotonic() - started):.1f} ms\n"
            )

    def _drain(self) -> None:
        """Read a body we will not use, so the next request on this connection starts clean."""
        length = self.headers.get("Content-Length") or "0"
        if length.isdigit() and int(length) <= MAX_BODY_BYTES:
            self.rfile.read(int(length))
        else:
            self.close_connection = True

    def _not_allowed(self) -> None:
        self._drain()
        if self._endpoint() is None:
            return self._error(404, "not_found", "the endpoints are POST /decode and POST /encode")
        self._error(405, "method_not_allowed", f"{self.command} is not allowed here: use POST",
                    {"Allow": "POST, OPTIONS"})

    do_GET = do_HEAD = do_PUT = do_DELETE = do_PATCH = _not_allowed


def _address_family(host: str) -> int:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m durable_agents.payloadcodec.server",
        description="Codec server for the Temporal UI and CLI: decrypts payloads with the lab's codec keys.",
    )
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; loopback only unless "
                             f"{ALLOW_REMOTE_VARIABLE}=1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--origin", action="append", metavar="URL",
                        help=f"a UI origin allowed to call it, repeatable (default ${ORIGINS_VARIABLE}, else "
                             f"{' and '.join(DEFAULT_ORIGINS)})")
    parser.add_argument("--verbose", action="store_true", help="log each request to stderr (never a payload)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        codec = codec_from_env()
    except CodecConfigError as err:
        print(f"codec server: {err}", file=sys.stderr)
        return 2
    if codec is None:
        print("codec server: LAB_CODEC_KEY is not set: give it the keys the workers use (LAB_CODEC_KEY, "
              "LAB_CODEC_KEY_ID, LAB_CODEC_DECRYPT_ONLY_KEYS); see docs/deploy.md", file=sys.stderr)
        return 2
    try:
        origins = origins_from(args.origin, os.environ)
    except ValueError as err:
        print(f"codec server: bad origin (--origin or {ORIGINS_VARIABLE}): {err}", file=sys.stderr)
        return 2
    if not 0 <= args.port <= 65535:
        print(f"codec server: port {args.port} is out of range; give 0 to 65535 (0 picks a free port)", file=sys.stderr)
        return 2
    host = args.host
    token = (os.environ.get(TOKEN_VARIABLE) or "").strip() or None
    if token is not None and len(token) < 16:
        print(f"codec server: {TOKEN_VARIABLE} is too short to be a secret: give at least 16 characters "
              "(python -c 'import secrets; print(secrets.token_urlsafe(24))')", file=sys.stderr)
        return 2
    if not is_loopback(host) and os.environ.get(ALLOW_REMOTE_VARIABLE) != "1":
        print(
            f"codec server: refusing to listen on {host!r}: the codec server has no authentication and "
            "decrypts any payload it is sent. Use --host 127.0.0.1, or set "
            f"{ALLOW_REMOTE_VARIABLE}=1 where the network is private (e.g. inside a container) or "
            "behind a proxy that authenticates its callers.",
            file=sys.stderr,
        )
        return 2
    try:
        server = CodecServer((host, args.port), _address_family(host), codec, origins, verbose=args.verbose,
                             token=token)
    except OSError as exc:
        print(f"codec server: cannot listen on {host}:{args.port}: {exc.strerror or exc}. "
              "Stop the other process on that port, or pass --port 0 to pick a free one.", file=sys.stderr)
        return 1

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="codec-http")
    serving.start()
    bound_host, bound_port = server.socket.getsockname()[:2]
    shown_host = f"[{bound_host}]" if ":" in str(bound_host) else bound_host
    # Names and origins only: never key material.
    print(f"codec server: decrypts key ids {', '.join(codec.key_ids)}, encrypts with {codec.key_id!r}; "
          f"CORS origins {', '.join(origins)}", flush=True)
    print(f"codec server listening on http://{shown_host}:{bound_port}", flush=True)
    try:
        stop.wait()
    finally:
        server.shutdown()
        serving.join()
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
