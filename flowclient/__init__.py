"""Client-side helpers shared by worker.py, starter.py, the demo, the lessons
and the tests: how to connect (``connect``), how to start, follow and retry a
run (``runs``) and how to read a run back (``status``)."""
