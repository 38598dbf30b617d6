"""A probe workflow whose history holds a cancelled attempt of a step, for
tests/test_in_doubt.py: what ``durable_agents.flowclient.status`` makes of
ActivityTaskCancelRequested and ActivityTaskCanceled, written by a real
server, whatever the shipped workflow does with a cancel today.

It schedules one attempt of ``step`` (activity type = the step's name, id
``<step>/1``, as ``AgentFlow`` names them) on ``activity_queue`` and:

- ``mode="await"``: waits for it, so a cancel of the run cancels the attempt
  and, once the attempt has confirmed, ends the run cancelled;
- ``mode="signal"``: cancels the attempt when signalled ``cancel_attempt``,
  then runs attempt 2 (which completes) and fails the run, so the run closes
  with the step completed after a cancelled attempt.

Attempts are cancelled with ``WAIT_CANCELLATION_COMPLETED`` so that history
records how each one ended. The activities are the test's (by name here).
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityCancellationType


@workflow.defn(name="CancelledAttemptProbe")
class CancelledAttemptProbe:
    def __init__(self) -> None:
        self._cancel_attempt = False

    @workflow.signal
    def cancel_attempt(self) -> None:
        self._cancel_attempt = True

    @workflow.run
    async def run(self, step: str, mode: str, activity_queue: str) -> str:
        first = self._attempt(step, 1, "hang", activity_queue)
        if mode == "await":
            return await first  # a cancel of the run cancels the attempt and ends the run cancelled
        await workflow.wait_condition(lambda: self._cancel_attempt)
        first.cancel()
        try:
            await first
        except ActivityError:
            pass  # cancelled, as asked
        await self._attempt(step, 2, "complete", activity_queue)
        raise ApplicationError("probe: the run ends here, after the step completed", non_retryable=True)

    @staticmethod
    def _attempt(step: str, attempt: int, what: str, queue: str):
        return workflow.start_activity(
            step, what, activity_id=f"{step}/{attempt}", task_queue=queue,
            start_to_close_timeout=timedelta(minutes=2), heartbeat_timeout=timedelta(seconds=1),
            retry_policy=RetryPolicy(maximum_attempts=1),
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
