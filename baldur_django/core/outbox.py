"""A bounded queue for the package's background senders (the Slack notifier, the propagation
publisher): the caller's thread only offers an item and never waits; one sender thread takes
items and marks each one done; :meth:`Outbox.drained` lets a caller wait for the backlog.

Built on :class:`queue.Queue` and its unfinished-task count, so an item counts as waiting
from the moment it is accepted until the sender calls ``task_done()`` for it.
"""

from __future__ import annotations

import queue
from typing import Any

__all__ = ["Outbox"]


class Outbox(queue.Queue[Any]):
    """A ``queue.Queue`` that never blocks the producer and can be waited on with a timeout.

    Args:
        maxsize (int): items that may wait; an offer beyond that is refused.
    """

    def offer(self, item: Any) -> bool:
        """Queue *item* without waiting.

        Returns:
            bool: False when the queue was full (the item was not queued).
        """
        try:
            self.put_nowait(item)
        except queue.Full:
            return False
        return True

    def drained(self, timeout: float) -> bool:
        """Wait until every accepted item was marked done (``task_done()``).

        Args:
            timeout (float): seconds to wait at most.

        Returns:
            bool: True when nothing was left waiting within *timeout*.
        """
        with self.all_tasks_done:
            return self.all_tasks_done.wait_for(lambda: not self.unfinished_tasks, timeout)
