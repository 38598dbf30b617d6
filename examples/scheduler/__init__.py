"""An agent from another domain: a meeting scheduler's booking service and its client.

``service`` is a real HTTP service over its own SQLite file (room bookings and invites, each applied once
per ``Idempotency-Key``, replayed on a retry, refused on a reused key); ``client`` is the async client an
agent's tools call. Standard library only, plus ``httpx`` in the client; nothing from the rest of the repo.
"""
