"""What the worker says while the broker does not confirm its own publishes (docs/worker.md,
*Broker outages*): the next attempts, dead letters and next steps it publishes before
it acks the deliveries they replace.

Each such publish is made again until the broker confirms it (the same id and key:
a copy that did arrive runs once). A broker that blocks publishing connections (a
memory or disk alarm: it reads nothing more from them, so no confirm comes) fails
every try of every held publish, each after the confirm timeout or at once when a
failed try closed the connection under the others: over a 45 s alarm, one line per
try was ~1,200 WARNING lines. This says it once: a WARNING at the first failure (the
error says whether the broker reported the connection blocked), an INFO when a publish
is confirmed again, with how long and how many tries it took; the tries between are
at DEBUG.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from broker_jobs.plural import plural

log = logging.getLogger(__name__)


class PublishOutage:
    """The worker's unconfirmed publishes, said once per outage."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since: float | None = None
        self._tries = 0
        #: When the last outage ended: a try begun before it belongs to that outage.
        self._ended_at: float | None = None

    def now(self) -> float:
        """The time a try begins, for :meth:`failed`."""
        return self._clock()

    def describe(self) -> str | None:
        """``/readyz``'s reason while publishes fail (None otherwise); only reads."""
        since = self._since
        if since is None:
            return None
        return (
            f"the broker has confirmed none of this worker's publishes for"
            f" {self._clock() - since:.0f} s (a memory or disk alarm blocks publishing?):"
            " the deliveries they replace are held"
        )

    def failed(self, error: BaseException, began: float) -> None:
        """A try begun at ``began`` (:meth:`now`) failed on the link: it is made again.
        One begun before the last outage ended is that outage's straggler (its
        confirm timed out after another publish's came): no new outage."""
        ended = self._ended_at
        if self._since is not None or (ended is not None and began < ended):
            self._tries += 1
            log.debug("a publish failed again (%s: %s)", type(error).__name__, _what(error))
            return
        self._tries = 1
        self._since = began  # no confirm since that try began
        log.warning(
            "a publish met a broken link (%s: %s); it is made again until the broker"
            " confirms it, holding the delivery it replaces (said once: the tries"
            " until then are logged at DEBUG)",
            type(error).__name__,
            _what(error),
        )

    def confirmed(self) -> None:
        """A publish was confirmed: an outage is over."""
        if self._since is None:
            return
        log.info(
            "the broker confirms publishes again after %.1f s (%s failed meanwhile)",
            self._clock() - self._since,
            plural(self._tries, "try", "tries"),
        )
        self._since, self._tries = None, 0
        self._ended_at = self._clock()


def _what(error: BaseException) -> str:
    """``error``'s text; a bare timeout's (a confirm that never came) said in words."""
    if str(error) or not isinstance(error, TimeoutError):
        return str(error)
    return (
        "no confirm in time; a broker blocking publishing connections (a memory or disk"
        " alarm) confirms nothing until the alarm clears"
    )
