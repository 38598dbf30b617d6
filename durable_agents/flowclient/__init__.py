"""The project's side of Temporal, shared by worker.py, starter.py, the lab,
the lessons and the tests: how to connect (``connect``), start, follow and
retry a run (``runs``), read a run back from its history (``status``), the
worker's options (``worker_options``), its logs and metrics. Payload
encryption, which workers and clients both use, is ``payloadcodec``."""
