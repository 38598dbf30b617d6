"""``python -m payloadcodec new-key | check``: make a key, or say what this environment would do."""

from payloadcodec import main

raise SystemExit(main())
