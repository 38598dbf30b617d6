"""The worker's Prometheus metrics: the SDK's own (workflow and activity task
latencies, poll and schedule-to-start times, slots, sticky cache, request
counts), served by the SDK's core when ``LAB_METRICS_ADDRESS`` asks for them.

``LAB_METRICS_ADDRESS``
    ``IP:PORT`` to serve ``http://IP:PORT/metrics`` on, e.g.
    ``127.0.0.1:9464`` (``[::1]:9464`` for IPv6). Unset or empty: no metrics
    endpoint. A loopback address only, unless ``LAB_METRICS_ALLOW_REMOTE=1``
    says the network is private (the endpoint has no authentication; the same
    rule as the provider's and the codec server's).

The SDK exposes its metrics through a ``temporalio.runtime.Runtime`` with a
``PrometheusConfig``; the client is connected on that runtime and the worker
built on the client uses it. Metric names carry the SDK's ``temporal_``
prefix, e.g. ``temporal_workflow_task_execution_latency`` and
``temporal_activity_execution_latency`` (histograms, milliseconds), and
``temporal_workflow_completed`` (counter). Each series is labelled with the
task queue, the namespace and, for activities, the activity type.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping

ADDRESS_VARIABLE = "LAB_METRICS_ADDRESS"
ALLOW_REMOTE_VARIABLE = "LAB_METRICS_ALLOW_REMOTE"


def metrics_address(env: Mapping[str, str] | None = None) -> str | None:
    """The validated ``IP:PORT`` from the environment, or None; ValueError says what to give."""
    env = os.environ if env is None else env
    raw = (env.get(ADDRESS_VARIABLE) or "").strip()
    if not raw:
        return None
    host, sep, port_text = raw.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    example = f"give IP:PORT, e.g. {ADDRESS_VARIABLE}=127.0.0.1:9464"
    if not sep or not host:
        raise ValueError(f"{ADDRESS_VARIABLE}={raw!r} has no port: {example}")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{ADDRESS_VARIABLE}={raw!r}: {host!r} is not an IP address (names are not "
                         f"accepted by the SDK's exporter): {example}") from None
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{ADDRESS_VARIABLE}={raw!r}: the port must be 1 to 65535 (a fixed one: "
                         f"Prometheus scrapes a known address): {example}")
    if not ip.is_loopback and env.get(ALLOW_REMOTE_VARIABLE) != "1":
        raise ValueError(
            f"{ADDRESS_VARIABLE}={raw!r} is not a loopback address: the metrics endpoint has no "
            f"authentication. Use 127.0.0.1, or set {ALLOW_REMOTE_VARIABLE}=1 where the network is "
            "private (e.g. inside a container, for a Prometheus beside it)"
        )
    return f"[{ip}]:{port_text}" if ip.version == 6 else f"{ip}:{port_text}"


def metrics_runtime(env: Mapping[str, str] | None = None):
    """(Runtime, URL) serving Prometheus metrics, or (None, None) when not asked for.

    Raises ValueError for a bad address or one that cannot be bound (in use)."""
    address = metrics_address(env)
    if address is None:
        return None, None
    from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

    try:
        runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address)))
    except ValueError as err:  # e.g. "Failed starting Prometheus exporter: Address already in use"
        raise ValueError(f"{ADDRESS_VARIABLE}={address}: {err}. Pick a free port") from None
    return runtime, f"http://{address}/metrics"
