"""Building the steps' dependencies from the environment: the composition root
shared by the Temporal worker and the hand-rolled runner, so both engines talk
to the same provider, model and memory in the same way.

- ``PROVIDER_URL``: the provider (default http://127.0.0.1:8780);
- ``LLM_BASE_URL`` / ``LLM_MODEL`` / ``LLM_API_KEY``: the model (offline by default);
- ``MEMORY_DB``: the conversation memory store (see ``memory``);
- ``LAB_STEP_SECONDS``: slow each step down for demonstrations (default 0).
"""

from __future__ import annotations

import os
from typing import Mapping

from steps.flow import StepDeps
from steps.limits import InputError


def pace_from_env(env: Mapping[str, str]) -> float:
    raw = env.get("LAB_STEP_SECONDS") or "0"
    try:
        pace = float(raw)
        if pace < 0 or pace > 600:
            raise ValueError
    except ValueError:
        raise InputError(f"LAB_STEP_SECONDS={raw!r} must be a number of seconds between 0 and 600") from None
    return pace


def deps_from_env(env: Mapping[str, str] | None = None) -> StepDeps:
    from llm import model_from_env
    from provider.client import ProviderClient, provider_url_from_env

    env = os.environ if env is None else env
    return StepDeps(
        provider=ProviderClient(provider_url_from_env(env)),
        llm=model_from_env(env),
        context=lambda conversation_id: [],
        pace_seconds=pace_from_env(env),
    )
