"""The ``effects`` table a transactional handler writes, in the workers' own store.

A handler of ``bench.recovery`` or ``bench.faults`` inserts its job's key, the wall
time it ran and its pid through the store's connection, in the job's transaction: a
job run twice shows as two rows, a lost job as none.
"""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
from pathlib import Path
from typing import Any


class Effects:
    """The table the handler writes, in the store's database: SQLite or PostgreSQL."""

    def __init__(self, workdir: Path, dsn: str | None, *, prefix: str) -> None:
        """SQLite: the file ``workdir/store.db``; PostgreSQL: a fresh schema
        ``<prefix>_<hex>`` of ``dsn``."""
        self.dsn = dsn
        if dsn is None:
            self.path = workdir / "store.db"
            self.store_url = f"sqlite:///{self.path}"
            self.table = "effects"
            self.mark = "?"
        else:
            self.schema = f"{prefix}_{secrets.token_hex(4)}"
            separator = "&" if "?" in dsn else "?"
            self.store_url = f"{dsn}{separator}schema={self.schema}"
            self.table = f'"{self.schema}".effects'
            self.mark = "%s"

    @property
    def kind(self) -> str:
        return "sqlite" if self.dsn is None else "postgresql"

    def create(self) -> None:
        if self.dsn is not None:
            self._execute(f'CREATE SCHEMA "{self.schema}"')
        self._execute(
            f"CREATE TABLE {self.table}"
            " (key TEXT NOT NULL, ran_at DOUBLE PRECISION NOT NULL, pid INTEGER NOT NULL)"
        )

    def insert_sql(self) -> str:
        m = self.mark
        return f"INSERT INTO {self.table} (key, ran_at, pid) VALUES ({m}, {m}, {m})"

    def first_after(self, moment: float) -> float | None:
        """The earliest run later than ``moment`` (wall time), if any."""
        rows = self._execute(
            f"SELECT MIN(ran_at) FROM {self.table} WHERE ran_at > {self.mark}", (moment,)
        )
        value = rows[0][0] if rows else None
        return None if value is None else float(value)

    def count(self) -> int:
        return int(self._execute(f"SELECT COUNT(*) FROM {self.table}")[0][0])

    def runs(self) -> dict[str, list[float]]:
        """Every key's run times, earliest first."""
        found: dict[str, list[float]] = {}
        for key, ran_at in self._execute(f"SELECT key, ran_at FROM {self.table} ORDER BY ran_at"):
            found.setdefault(str(key), []).append(float(ran_at))
        return found

    def drop(self) -> None:
        if self.dsn is not None:
            with contextlib.suppress(Exception):
                self._execute(f'DROP SCHEMA "{self.schema}" CASCADE')

    def _execute(self, sql: str, parameters: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        if self.dsn is None:
            with contextlib.closing(sqlite3.connect(self.path, timeout=30)) as db:
                rows = db.execute(sql, parameters).fetchall()
                db.commit()
                return rows
        import psycopg  # noqa: PLC0415 - only with --store postgresql://

        with psycopg.connect(self.dsn, autocommit=True) as db:
            cursor = db.execute(sql.encode(), parameters or None)
            return list(cursor.fetchall()) if cursor.description else []
