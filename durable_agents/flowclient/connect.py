"""Connecting to Temporal, configured through the environment only.

Uses the SDK's own environment configuration (``temporalio.envconfig``), so the
same code reaches the local dev server, a cluster or Temporal Cloud:

- ``TEMPORAL_ADDRESS`` (default ``localhost:7233``), ``TEMPORAL_NAMESPACE``
  (default ``default``);
- ``TEMPORAL_API_KEY`` (turns TLS on), ``TEMPORAL_TLS``,
  ``TEMPORAL_TLS_CLIENT_CERT_PATH`` / ``TEMPORAL_TLS_CLIENT_KEY_PATH`` for mTLS;
- ``TEMPORAL_PROFILE`` and ``TEMPORAL_CONFIG_FILE`` to pick a profile from a
  TOML file.

The lab adds settings of its own: ``TASK_QUEUE`` (default ``agent-flow``);
``LAB_CODEC_KEY`` / ``LAB_CODEC_KEY_ID`` / ``LAB_CODEC_DECRYPT_ONLY_KEYS`` turn on
payload encryption (``payloadcodec``); ``LAB_OTEL`` turns on OpenTelemetry
tracing (``tracing_interceptors`` below). Every process that connects here (worker, starter,
demo, run-record compare, tests) gets the same data converter and interceptors
from the same environment, so what one encrypts the others can read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from temporalio.client import Client
from temporalio.envconfig import ClientConfig

from durable_agents.payloadcodec import data_converter_from_env

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_TASK_QUEUE = "agent-flow"


def task_queue(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("TASK_QUEUE") or DEFAULT_TASK_QUEUE


def connect_config(env: Mapping[str, str] | None = None) -> dict:
    """The keyword arguments for ``Client.connect``, from envconfig."""
    env = dict(os.environ if env is None else env)
    config = dict(ClientConfig.load_client_connect_config(override_env_vars=env))
    config.setdefault("target_host", DEFAULT_ADDRESS)
    return config


def describe_target(config: Mapping) -> str:
    """Where we connect, for messages; never includes the API key."""
    tls = " (TLS)" if config.get("tls") else ""
    return f"{config['target_host']} namespace {config.get('namespace', 'default')}{tls}"


OTEL_MODES = ("console", "otlp")
_tracer_provider = None  # one per process, made on first use


def tracing_interceptors(env: Mapping[str, str] | None = None, tracer_provider=None) -> list:
    """``[TracingInterceptor]`` when ``LAB_OTEL`` asks for tracing, else ``[]``.

    ``LAB_OTEL=console`` (or ``1``) writes each finished span as JSON to stderr;
    ``LAB_OTEL=otlp`` sends them to an OTLP/gRPC collector (the standard
    ``OTEL_EXPORTER_OTLP_ENDPOINT``, default localhost:4317; needs the ``otlp``
    extra). ``OTEL_SERVICE_NAME`` names the process (default durable-agent-lab).
    Set on a client, the interceptor also applies to workers built on it: one
    ``RunActivity:<step>`` span per step attempt, child of the workflow's spans
    when the starter traced the start. Pass ``tracer_provider`` to collect spans
    yourself (tests use an in-memory exporter).
    """
    global _tracer_provider
    env = os.environ if env is None else env
    mode = (env.get("LAB_OTEL") or "").strip().lower()
    if tracer_provider is None and mode in ("", "0", "off", "false", "no"):
        return []
    if mode == "1":
        mode = "console"
    if tracer_provider is None and mode not in OTEL_MODES:
        raise ValueError(f"LAB_OTEL={mode!r} is not one of console, otlp (or unset for no tracing)")
    try:
        from temporalio.contrib.opentelemetry import TracingInterceptor
    except ImportError as err:
        raise ValueError(
            "LAB_OTEL is set but OpenTelemetry is not installed: pip install 'durable-agent-lab[otel]'"
        ) from err
    if tracer_provider is None:
        if _tracer_provider is None:
            _tracer_provider = _make_tracer_provider(mode)
        tracer_provider = _tracer_provider
    return [TracingInterceptor(tracer_provider.get_tracer("durable-agent-lab"))]


def _make_tracer_provider(mode: str):
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "durable-agent-lab"})
    provider = TracerProvider(resource=resource)
    if mode == "console":
        # Simple (synchronous) so a span is out before a SIGKILL can lose it.
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    else:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError as err:
            raise ValueError(
                "LAB_OTEL=otlp needs the OTLP exporter: pip install 'durable-agent-lab[otlp]'"
            ) from err
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def flush_tracing(timeout_ms: int = 5000) -> None:
    """Send spans still buffered (OTLP batches) before the process exits."""
    if _tracer_provider is not None:
        _tracer_provider.force_flush(timeout_ms)


def client_options(env: Mapping[str, str] | None = None) -> dict:
    """Data converter (payload codec) and interceptors (tracing) from the environment.

    Raises ``CodecConfigError`` (a ValueError) for a bad key, before any connection.
    """
    options: dict = {"data_converter": data_converter_from_env(env)}
    interceptors = tracing_interceptors(env)
    if interceptors:
        options["interceptors"] = interceptors
    return options


async def connect(env: Mapping[str, str] | None = None, **overrides) -> Client:
    """A client configured from ``env`` (default: the process environment).

    ``overrides`` win over both envconfig and the lab's own options (e.g. a test
    passing ``data_converter=temporalio.converter.default()`` to see raw payloads).
    """
    config = connect_config(env)
    options = {**client_options(env), **overrides}
    try:
        return await Client.connect(**config, **options)
    except Exception as err:  # the SDK raises RuntimeError with a transport message
        raise ConnectionError(
            f"cannot reach Temporal at {describe_target(config)}: {err}. "
            "Start the dev server (docs/commands.md, \"The manual way\") or set TEMPORAL_ADDRESS."
        ) from err


def exit_now(code: int) -> None:
    """Exit without interpreter teardown.

    The SDK's Rust runtime threads can abort a short-lived client process
    during finalisation ("PyGILState_Release ... must be current", SIGABRT;
    sdk-python#300, seen here about one run in twenty). Everything is flushed
    first, and nothing else needs tearing down, so skip finalisation.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # the reader went away, or the stream is closed
            pass
    os._exit(code)
