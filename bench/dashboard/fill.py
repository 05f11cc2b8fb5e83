"""Writing ``bench.dashboard``'s rows into a store, through its own schema (opened
first: its tables, indexes and triggers), fast: SQLite without fsyncs, PostgreSQL by
COPY."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from bench.dashboard.rows import Row, chunks
from broker_jobs.store import SQLiteStore

#: Rows per executemany (and per transaction when filling).
CHUNK = 50_000


def sqlite_text(moment: datetime | None) -> str | None:
    """A time as :class:`SQLiteStore` writes it (fixed-width UTC ISO text)."""
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="microseconds")


def fill_sqlite(path: Path, rows: Iterator[Row]) -> int:
    """Write ``rows`` into the SQLite store at ``path`` (its schema made by opening it)."""
    SQLiteStore(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("PRAGMA cache_size = -262144")  # 256 MiB
    written = 0
    try:
        for chunk in chunks(rows, CHUNK):
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO broker_jobs_records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    tuple(sqlite_text(v) if isinstance(v, datetime) else v for v in row.record)
                    for row in chunk
                ],
            )
            conn.executemany(
                "INSERT INTO broker_jobs_executions (idempotency_key, number, job_id, attempt,"
                " worker, started_at, finished_at, outcome, error)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (row.record[0], number, row.record[1], attempt, worker,
                     sqlite_text(started), sqlite_text(finished), outcome, error)
                    for row in chunk
                    for number, (attempt, worker, started, finished, outcome, error)
                    in enumerate(row.executions, 1)
                ],
            )  # fmt: skip
            conn.execute("COMMIT")
            written += len(chunk)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return written


def fill_postgres(dsn: str, schema: str, rows: Iterator[Row]) -> int:
    """Write ``rows`` into the PostgreSQL store in ``schema`` (COPY, then ANALYZE)."""
    import psycopg  # noqa: PLC0415
    from psycopg import sql  # noqa: PLC0415

    from broker_jobs.store.postgres import PostgresStore  # noqa: PLC0415

    PostgresStore(dsn, schema=schema).close()
    records = sql.Identifier(schema, "broker_jobs_records")
    executions = sql.Identifier(schema, "broker_jobs_executions")
    written = 0
    with psycopg.connect(dsn, autocommit=False) as conn:
        for chunk in chunks(rows, CHUNK):
            with conn.cursor() as cur:
                with cur.copy(sql.SQL("COPY {} FROM STDIN").format(records)) as copy:
                    for row in chunk:
                        copy.write_row(row.record)
                with cur.copy(
                    sql.SQL(
                        "COPY {} (idempotency_key, job_id, attempt, worker, started_at,"
                        " finished_at, outcome, error) FROM STDIN"
                    ).format(executions)
                ) as copy:
                    for row in chunk:
                        for execution in row.executions:
                            copy.write_row((row.record[0], row.record[1], *execution))
            conn.commit()
            written += len(chunk)
        conn.autocommit = True
        conn.execute(sql.SQL("ANALYZE {}").format(records))
        conn.execute(sql.SQL("ANALYZE {}").format(executions))
    return written
