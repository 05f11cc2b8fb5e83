"""Open a store from a URL (settings, the command line):

    memory://[?max_finished=N]         MemoryStore (tests, jobs needing no durability)
    sqlite:///relative/path.db         SQLiteStore, path relative to the working directory
    sqlite:////absolute/path.db        SQLiteStore, absolute path
    postgresql://user:pass@host:5432/db[?schema=name&...]   PostgresStore (also postgres://)

A PostgreSQL URL is handed to libpq as it is (so every libpq parameter works, e.g.
``sslmode=require``), except ``schema``, which names the schema of the store's tables.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

from broker_jobs.store.base import Store
from broker_jobs.store.errors import StoreError
from broker_jobs.store.memory import MemoryStore
from broker_jobs.store.sqlite import SQLiteStore
from broker_jobs.store.values import mask_dsn

__all__ = ["ACCEPTED", "mask_dsn", "open_store"]

#: The URL forms open_store accepts, for messages and docs.
ACCEPTED = (
    "sqlite:///relative/path.db",
    "sqlite:////absolute/path.db",
    "postgresql://user:password@host:5432/database",
    "memory://",
)


def _memory_store(url: str, rest: str) -> MemoryStore:
    """``memory://``, or ``memory://?max_finished=N`` (finished jobs kept)."""
    where, _, query = rest.partition("?")
    if where.strip("/"):
        raise StoreError(f"memory:// takes no host or path, got {mask_dsn(url)!r}")
    options = parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(options) - {"max_finished"})
    if unknown:
        raise StoreError(f"memory:// takes only ?max_finished=N, got {unknown[0]!r} in {url!r}")
    if "max_finished" not in options:
        return MemoryStore()
    value = options["max_finished"][-1]
    if not value.isdigit() or int(value) < 1:
        raise StoreError(
            f"memory://?max_finished= must be a whole number >= 1 (finished jobs kept),"
            f" got {value!r}"
        )
    return MemoryStore(int(value))


def open_store(url: str, *, must_exist: bool = False) -> Store:
    """The store ``url`` names; :class:`StoreError` for a URL it cannot open.

    ``must_exist``: for commands that only read (``beat status``): an SQLite file
    that does not exist is an error, not a new empty ledger that answers "nothing"."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        scheme = ""
    if scheme == "memory":
        return _memory_store(url, rest)
    if scheme == "sqlite":
        path = _sqlite_path(url, rest)
        if must_exist and not Path(path).is_file():
            raise StoreError(
                f"no ledger at {url!r} ({Path(path).resolve()} does not exist): give the"
                " store the workers use, with --store or BROKER_JOBS_STORE"
            )
        return SQLiteStore(path)
    if scheme in ("postgresql", "postgres"):
        from broker_jobs.store.postgres import PostgresStore  # noqa: PLC0415 - psycopg is slow

        dsn, schema = _pop_schema(url)
        return PostgresStore(dsn, schema=schema)
    raise StoreError(
        f"unsupported store URL {mask_dsn(url)!r}: use one of {', '.join(ACCEPTED)}"
        " (postgres:// works too)"
    )


def _sqlite_path(url: str, rest: str) -> str:
    # sqlite:///a.db -> rest "/a.db" -> "a.db"; sqlite:////abs.db -> rest "//abs.db" -> "/abs.db"
    host, slash, path = rest.partition("/")
    if host or not slash or not path or "?" in path or "#" in path:
        raise StoreError(
            f"bad SQLite store URL {url!r}: use sqlite:///relative/path.db or"
            " sqlite:////absolute/path.db (three slashes, then the path; no host, no query)"
        )
    return path


def _pop_schema(url: str) -> tuple[str, str | None]:
    """Take ``schema=`` out of the query (libpq rejects parameters it does not know)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schemas = [value for name, value in query if name == "schema"]
    if not schemas:
        return url, None
    if len(schemas) > 1 or not schemas[0]:
        raise StoreError(f"store URL {mask_dsn(url)!r}: give schema= once, with a name")
    rest = urlencode([(name, value) for name, value in query if name != "schema"])
    return urlunsplit(parts._replace(query=rest)), schemas[0]
