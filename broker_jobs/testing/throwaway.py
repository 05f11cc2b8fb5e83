"""What the throwaway servers (a RabbitMQ node, a cluster of them, a PostgreSQL) do
alike: find the newest installed version of their binaries, quote the end of a log
in an error, and live for one ``with`` block (started at its start, stopped and
deleted at its end, and cleaned up too when the start fails: a half-started server
is never left behind)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Self


def newest(bin_dirs: Iterable[Path]) -> Path | None:
    """The directory of the highest version among ``bin_dirs``, read off the digits of
    each one's parent (``.../postgresql/16/bin``, ``.../rabbitmq_server-3.10.8/sbin``)."""
    return max(
        bin_dirs,
        key=lambda path: [int(number) for number in re.findall(r"\d+", path.parent.name)],
        default=None,
    )


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` of a log, headed by its path, for an error message."""
    try:
        text = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        text = f"<unreadable: {exc}>"
    return f"--- tail of {path} ---\n{text}"


class Throwaway:
    """A server for one ``with`` block: :meth:`start` on entering, :meth:`cleanup` on
    leaving, and also when the start fails. :meth:`cleanup` halts the server and
    deletes its directories (:meth:`scratch_dirs`)."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def scratch_dirs(self) -> tuple[Path, ...]:
        """The directories :meth:`cleanup` deletes."""
        raise NotImplementedError

    def halt(self) -> None:
        """End the server's processes just before its directories are deleted:
        :meth:`stop`, unless a server has a quicker way that loses only what is
        deleted next anyway."""
        self.stop()

    def cleanup(self) -> None:
        """Halt the server if needed and delete its directories."""
        try:
            self.halt()
        finally:
            for directory in self.scratch_dirs():
                shutil.rmtree(directory, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()
