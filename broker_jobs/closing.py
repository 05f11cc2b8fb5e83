"""What a ``with`` block closes: the publishers, the stores, the dead-letter queues'
reader and the testing kit are used as ``with X(...) as x:`` and closed at its end."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    """``with thing:`` gives ``thing`` and calls its ``close()`` at the block's end,
    whatever ended it (an exception goes on)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.close()
