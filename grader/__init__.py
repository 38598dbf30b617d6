"""The grader of the lab's exercises (``exercises/``): it runs a learner's
code as real processes under real SIGKILLs against the real provider, and
judges by witnesses the learner's code cannot forge.

- ``grader.grade``: the command, ``python -m grader.grade N``;
- ``grader.report``: what a grading found, as data (``--json``, ``--report``); ``grader.classroom``: a
  class, each learner's submission graded by a grader process of its own (``--class DIR``);
- ``grader.check_record``, ``check_intents``, ``check_resume``, ``check_memory``, ``check_terminal``,
  ``check_temporal``, ``check_loop``: what exercises 1-7 must show, in the lesson's words, one module per
  check (``grader.expect``: what the record-track checks expect alike; ``grader.temporal``: driving 6;
  ``grader.registry``: every check, each with its deadline and main file; ``grader.todos``: each TODO's
  exercise and file, read from the practice files);
- ``grader.harness``: the learner's program as processes, and how a check fails;
- ``grader.evidence``: what is read (the provider, the model, the record file);
- ``grader.model``: the model stand-in that counts draft calls and the loop's turns;
- ``grader.launch``: the bootstrap in the learner's process (kills between commits).

It never imports the finished engines (``durable_agents/runrecord/``, ``durable_agents.memory.window``):
the exercises are judged against the lesson, not against an answer's code.
"""
