"""Connecting to Temporal, configured through the environment only.

Uses the SDK's own environment configuration (``temporalio.envconfig``), so the
same code reaches the local dev server, a cluster or Temporal Cloud:

- ``TEMPORAL_ADDRESS`` (default ``localhost:7233``), ``TEMPORAL_NAMESPACE``
  (default ``default``);
- ``TEMPORAL_API_KEY`` (turns TLS on), ``TEMPORAL_TLS``,
  ``TEMPORAL_TLS_CLIENT_CERT_PATH`` / ``TEMPORAL_TLS_CLIENT_KEY_PATH`` for mTLS;
- ``TEMPORAL_PROFILE`` and ``TEMPORAL_CONFIG_FILE`` to pick a profile from a
  TOML file.

The lab adds one setting of its own: ``TASK_QUEUE`` (default ``agent-flow``).
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

from temporalio.client import Client
from temporalio.envconfig import ClientConfig

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


async def connect(env: Mapping[str, str] | None = None, **overrides) -> Client:
    config = connect_config(env)
    try:
        return await Client.connect(**config, **overrides)
    except Exception as err:  # the SDK raises RuntimeError with a transport message
        raise ConnectionError(
            f"cannot reach Temporal at {describe_target(config)}: {err}. "
            "Start the dev server (see README) or set TEMPORAL_ADDRESS."
        ) from err


def exit_now(code: int) -> None:
    """Exit without interpreter teardown.

    The SDK's Rust runtime threads can abort a short-lived client process
    during finalisation ("PyGILState_Release ... must be current", SIGABRT;
    sdk-python#300, seen here about one run in twenty). Everything is flushed
    first, and nothing else needs tearing down, so skip finalisation.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
