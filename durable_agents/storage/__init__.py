"""Storage infrastructure shared by the project's SQLite stores, and nothing else.

``durable_agents.storage.sqlite`` opens a SQLite file the way the stores do, versions and
migrates its schema, and runs write transactions. It imports only the standard
library and knows nothing of runs, effects or messages, so the provider (the
independent judge of "exactly once") can use it without sharing any code with
the client side it judges.
"""
