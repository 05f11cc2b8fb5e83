"""Deliveries whose processing failed with an error nobody expected.

Such an error (a bug of ours, a message shaped in a way no check foresaw) gives the
delivery back to the queue. A message that makes it every time would come back
forever: on a classic queue (no delivery limit) thousands of times a minute, each
with its traceback. So the second failure of one message in this worker dead-letters
it (reason ``worker-error``, the error with it): kept, for an operator to read and
replay once the cause is fixed.
"""

from __future__ import annotations

from collections import OrderedDict

#: Failures of one message (by its message id) that dead-letter it.
LIMIT = 2
#: Message ids remembered (the oldest forgotten first): enough for a burst of them.
REMEMBERED = 1000


class Strikes:
    """Unexpected failures counted by message id, in this worker."""

    def __init__(self, limit: int = LIMIT, remembered: int = REMEMBERED) -> None:
        self._limit = limit
        self._remembered = remembered
        self._counts: OrderedDict[str, int] = OrderedDict()

    def out(self, message_id: str | None) -> bool:
        """Count one failure of ``message_id``: True when it reached the limit (the
        message is to be dead-lettered). A message without an id is never out."""
        if not message_id:
            return False
        count = self._counts.pop(message_id, 0) + 1
        if count >= self._limit:
            return True
        self._counts[message_id] = count
        while len(self._counts) > self._remembered:
            self._counts.popitem(last=False)
        return False
