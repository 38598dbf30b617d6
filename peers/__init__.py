"""The lab's agent loop beside the agent frameworks people pick for a durable agent on Temporal: pydantic-ai's
``TemporalDurability`` agent and the OpenAI Agents SDK's Temporal integration, under the same kills, against
the same provider, model stand-in and dev server, on the same clock (``python -m peers``, ``make peers``;
docs/peers.md).

Its lanes need the peer frameworks, which live in ``.venv-peers`` (``make peers``), not in ``.venv``;
``peers.lane`` and ``peers.tools`` need none.

- ``peers.lane``: the contract every lane fills (its name, variants, worker command, run start; the crash points);
- ``peers.tools``: the four tools' bodies against the provider, shared by every lane (no framework);
- ``peers.pydantic_ai_lane``, ``peers.pydantic_ai_agent``, ``peers.pydantic_ai_workflow``,
  ``peers.pydantic_ai_worker``: pydantic-ai's lane, its agent and tools, its workflow, its worker;
- ``peers.openai_agents_lane`` and the ``peers.openai_agents_*`` modules it names: the OpenAI Agents SDK's lane;
- ``peers.subjects``: a lane's variant or the lab's own loop behind one shape, for the driver;
- ``peers.faults``: one run per subject and fault, killed and finished by a standby, counted;
- ``peers.clock``: time per turn, history events per turn, a kill to the run done with a standby ready;
- ``peers.tables``: the tables, as Markdown;
- ``peers.__main__``: the driver.
"""
