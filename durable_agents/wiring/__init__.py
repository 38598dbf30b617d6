"""The edge: where the steps' interfaces (``durable_agents.steps.ports``) meet their
implementations. Every process that runs steps builds its ``StepDeps`` here,
from the environment (``durable_agents.wiring.deps_from_env``): the Temporal worker, the run
record's and DBOS's CLIs, the lesson's in-memory engine, the benches. So the
engines share one way of reaching the provider, the models (the draft's and
the agent loop's: one instance when a server answers both) and memory, and no
engine or step builds its own.

Nothing inside the engines imports this package: it imports them (or what
they need), never the other way round.
"""

from durable_agents.wiring.deps import deps_from_env, pace_from_env, preload
from durable_agents.wiring.memory import close_memory, memory_from_env

__all__ = ["close_memory", "deps_from_env", "memory_from_env", "pace_from_env", "preload"]
