"""``python -m durable_agents.payloadcodec new-key | check``: make a key, or say what this environment would do."""

from durable_agents.payloadcodec import main

raise SystemExit(main())
