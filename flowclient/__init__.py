"""Client-side helpers shared by worker.py, starter.py, the demo and the tests:
how to connect (``connect``) and how to read a run back (``status``)."""
