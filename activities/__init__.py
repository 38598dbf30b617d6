"""The lab's Temporal activities, which are the adapter's: ``durable_agents.activities``.

- ``FlowActivities`` (``durable_agents.activities``): the three-step flow's, one typed input each, the
  idempotency key derived from the run id and the step;
- ``LoopActivities`` (``durable_agents.activities.loop``): the agent loop's, ``model_turn`` and ``tool_call``.

The code lives in the package (tests/test_architecture.py checks that these are the package's classes).
"""

from durable_agents.activities import FlowActivities
from durable_agents.activities.loop import LoopActivities

__all__ = ["FlowActivities", "LoopActivities"]
