"""``python -m provider``: run the provider until SIGTERM or SIGINT."""

from provider.server import main

raise SystemExit(main())
