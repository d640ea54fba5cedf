"""The benchmark store: one embedded SQLite file (stdlib :mod:`sqlite3`).

Each finished job is one row, written in its own transaction, so an interrupted
run leaves only whole rows behind; the primary key (instance, method, seed,
time_limit_s, version) lets a re-run skip what is done.  Only the parent process
writes.

A store another process keeps locked is waited for (``busy_timeout_s``, retried in
short slices); a row that still cannot be written stays in memory and is written
with the next one, and one that cannot be written when the store closes is saved
beside it (``<store>.pending.json``, written into the store when it is next
opened for writing): a computed row is never lost.  ``readonly=True`` opens the
store without writing anything (``bench report`` on a read-only file).

Columns added since schema version 1 (:data:`ADDED_COLUMNS`: ``variant``) have a
default, so no migration is needed: a store without them gets them (``ALTER TABLE
... ADD COLUMN``) when opened for writing, and reads them as their default when
opened read-only; older versions of pipette-cp still read and write such a store.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from pipette_cp.errors import InputFileError
from pipette_cp.suite.jobs import COLUMNS, CRASH, BenchRow

#: Default file name of the store.
DEFAULT_DB = "bench.sqlite"

#: How long a store locked by another process is waited for, s.
DEFAULT_BUSY_TIMEOUT_S = 60.0

#: Longest single wait of SQLite's own busy handler, s (then the store retries).
_SLICE_S = 1.0

T = TypeVar("T")

#: Bumped when the table changes; a store of another version is refused.
SCHEMA_VERSION = 1

_TYPES = {
    "seed": "INTEGER NOT NULL",
    "num_gpus": "INTEGER NOT NULL",
    "time_limit_s": "REAL NOT NULL",
    "wall_time_s": "REAL NOT NULL",
    "fits": "INTEGER",
    "plan_json": "TEXT",
    "message": "TEXT NOT NULL",
    "predictor": "TEXT NOT NULL",
    "layout": "TEXT NOT NULL",
    "variant": "TEXT NOT NULL DEFAULT ''",
}
#: Columns newer than the table of schema version 1, with the value old rows read as.
ADDED_COLUMNS: dict[str, Any] = {"variant": ""}
_TEXT_KEYS = ("instance", "method", "version", "family", "status", "timestamp")
_KEY = ("instance", "method", "seed", "time_limit_s", "version")


def _column(name: str) -> str:
    if name in _TYPES:
        return f"{name} {_TYPES[name]}"
    return f"{name} TEXT NOT NULL" if name in _TEXT_KEYS else f"{name} REAL"


_CREATE = (
    f"CREATE TABLE IF NOT EXISTS results ({', '.join(_column(c) for c in COLUMNS)}, "
    f"PRIMARY KEY ({', '.join(_KEY)}))"
)
_INSERT = (
    f"INSERT OR REPLACE INTO results ({', '.join(COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in COLUMNS)})"
)


class BenchStore:
    """Rows of benchmark results in a SQLite file.

    Parameters
    ----------
    path
        The SQLite file (created unless ``create`` is false or ``readonly``).
    create
        Whether a missing file is created.
    readonly
        Open without writing anything (no table, pragma or journal change); the
        file may be read-only.
    busy_timeout_s
        How long a lock held by another process is waited for (module doc).

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from pipette_cp.suite.jobs import Job, failed_row
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "b.sqlite"
    >>> with BenchStore(path) as store:
    ...     store.write(failed_row(Job("x", "greedy", 0, 8.0), "infeasible", "too big"))
    ...     [row.status for row in store.rows()]
    ['infeasible']
    """

    def __init__(
        self,
        path: str | Path,
        *,
        create: bool = True,
        readonly: bool = False,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    ) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self.busy_timeout_s = float(busy_timeout_s)
        self._pending: list[BenchRow] = []
        self._missing: set[str] = set()  # ADDED_COLUMNS an old store opened read-only lacks
        if (readonly or not create) and not self.path.exists():
            raise InputFileError(self.path, "no such file; run `pipette-cp bench` first")
        if self.path.exists() and not self.path.is_file():
            raise InputFileError(self.path, "is not a regular file; expected a SQLite store")
        try:
            self._conn = self._connect()
        except (sqlite3.Error, OSError) as exc:
            raise InputFileError(self.path, f"cannot open as a SQLite store: {exc}") from None
        try:
            self._retry(self._check_and_create)
        except (sqlite3.Error, OSError) as exc:
            self._conn.close()
            raise InputFileError(self.path, f"cannot open as a SQLite store: {exc}") from None
        except InputFileError:
            self._conn.close()
            raise
        if not readonly:
            self._write_saved_rows()

    def _connect(self) -> sqlite3.Connection:
        timeout = min(self.busy_timeout_s, _SLICE_S)
        if not self.readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return sqlite3.connect(self.path, timeout=timeout)
        uri = self.path.resolve().as_uri()
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=timeout)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                return conn  # waited for by the caller
            conn.close()  # a WAL store in a read-only folder: no -shm can be made
            return sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, timeout=timeout)
        return conn

    def _check_and_create(self) -> None:
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        query = "SELECT name FROM sqlite_master WHERE type='table'"
        tables = {r[0] for r in self._conn.execute(query)}
        if (tables and version != SCHEMA_VERSION) or (self.readonly and "results" not in tables):
            raise InputFileError(
                self.path,
                f"not a pipette-cp bench store of schema version {SCHEMA_VERSION} "
                f"(found {version}); use another --db",
            )
        if "results" in tables:
            self._missing = set(ADDED_COLUMNS) - self._columns()
        if self.readonly or ("results" in tables and self._wal() and not self._missing):
            return  # nothing to write: opens while another process holds the lock
        # WAL: readers (a report, a test polling the file) never block the writer
        self._conn.execute("PRAGMA journal_mode=WAL")
        with self._conn:
            self._conn.execute(_CREATE)
            self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            for name in sorted(set(ADDED_COLUMNS) - self._columns()):  # an older store
                try:
                    self._conn.execute(f"ALTER TABLE results ADD COLUMN {_column(name)}")
                except sqlite3.OperationalError as exc:  # added by another process meanwhile
                    if "duplicate column" not in str(exc).lower():
                        raise
        self._missing = set()

    def _columns(self) -> set[str]:
        return {r[1] for r in self._conn.execute("PRAGMA table_info(results)")}

    def _select(self) -> str:
        """The stored columns in :data:`COLUMNS` order (defaults for missing ones)."""
        return ", ".join(
            f"{ADDED_COLUMNS[c]!r} AS {c}" if c in self._missing else c for c in COLUMNS
        )

    def _wal(self) -> bool:
        return str(self._conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"

    def _retry(self, action: Callable[[], T]) -> T:
        """``action()``, retried while another process holds the lock, for up to the
        busy timeout; then :class:`InputFileError`."""
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                return action()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise _Locked(self.path, self.busy_timeout_s) from None
                time.sleep(0.05)

    def __enter__(self) -> BenchStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(raise_on_pending=exc is None)

    def close(self, *, raise_on_pending: bool = True) -> None:
        """Write the rows still pending (waiting for a lock up to the busy timeout);
        those that cannot be written are saved beside the store and reported
        (:class:`InputFileError` unless ``raise_on_pending`` is false)."""
        why = f"locked by another process for over {self.busy_timeout_s:g} s"
        try:
            if self._pending:
                self._flush()
        except InputFileError as exc:
            why = exc.problem
        finally:
            self._conn.close()
        if not self._pending:
            return
        count, saved = len(self._pending), self._saved_path()
        try:
            self._save_pending()
        except OSError as exc:
            raise InputFileError(
                self.path, f"{why}; {count} finished rows could not be saved to {saved}: {exc}"
            ) from None
        if raise_on_pending:
            raise InputFileError(
                self.path,
                f"{why}; {count} finished rows saved to {saved} (written into the store "
                "when it is next opened for writing)",
            )

    def write(self, row: BenchRow) -> None:
        """Insert (or replace) one row in its own transaction; while another process
        holds the lock the row is kept and written with the next (module doc)."""
        if self.readonly:
            raise InputFileError(self.path, "opened read-only; cannot write a row")
        self._pending.append(row)
        self._flush()

    def _flush(self) -> bool:
        """Write the pending rows in order; False if the lock outlasted the timeout."""
        while self._pending:
            values = [getattr(self._pending[0], c) for c in COLUMNS]
            try:
                self._retry(functools.partial(self._insert, values))
            except _Locked:
                return False
            except sqlite3.Error as exc:
                raise InputFileError(self.path, f"cannot write a row: {exc}") from None
            self._pending.pop(0)
        return True

    def _insert(self, values: list[Any]) -> None:
        with self._conn:  # commits, or rolls back on error: never half a row
            self._conn.execute(_INSERT, values)

    @property
    def pending(self) -> tuple[BenchRow, ...]:
        """Rows not yet in the file (another process held the lock too long)."""
        return tuple(self._pending)

    def _saved_path(self) -> Path:
        return self.path.with_name(self.path.name + ".pending.json")

    def _save_pending(self) -> None:
        saved = self._saved_path()
        by_key = {_key(r): r for r in [*self._read_saved(), *self._pending]}  # newest wins
        rows = [dataclasses.asdict(r) for r in by_key.values()]
        saved.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")

    def _read_saved(self) -> list[BenchRow]:
        saved = self._saved_path()
        if not saved.is_file():
            return []
        try:
            return [BenchRow(**data) for data in json.loads(saved.read_text(encoding="utf-8"))]
        except (OSError, ValueError, TypeError) as exc:
            raise InputFileError(saved, f"cannot read the saved rows: {exc}") from None

    def _write_saved_rows(self) -> None:
        saved = self._read_saved()
        if not saved:
            return
        self._pending.extend(saved)
        if self._flush():
            self._saved_path().unlink()

    def write_all(self, rows: Iterable[BenchRow]) -> None:
        for row in rows:
            self.write(row)

    def finished(self) -> set[tuple[Any, ...]]:
        """Keys of the jobs a re-run skips (every stored outcome but a crash)."""
        query = f"SELECT {', '.join(_KEY)} FROM results WHERE status != ?"
        stored = self._retry(lambda: {tuple(r) for r in self._conn.execute(query, (CRASH,))})
        return stored | {_key(r) for r in self._pending if r.status != CRASH}

    def rows(self) -> list[BenchRow]:
        """Every row, ordered by instance, method, seed, time limit, timestamp."""
        query = (
            f"SELECT {self._select()} FROM results "
            "ORDER BY instance, method, seed, time_limit_s, timestamp"
        )
        stored = self._retry(lambda: [_row(values) for values in self._conn.execute(query)])
        if not self._pending:
            return stored
        keys = {_key(r) for r in self._pending}
        merged = [r for r in stored if _key(r) not in keys] + self._pending
        return sorted(merged, key=lambda r: (*_key(r)[:4], r.timestamp))


class _Locked(InputFileError):
    def __init__(self, path: Path, waited_s: float) -> None:
        super().__init__(path, f"locked by another process (waited {waited_s:g} s); try again")


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _key(row: BenchRow) -> tuple[Any, ...]:
    return tuple(getattr(row, k) for k in _KEY)


def _row(values: tuple[Any, ...]) -> BenchRow:
    data = dict(zip(COLUMNS, values, strict=True))
    if data["fits"] is not None:
        data["fits"] = bool(data["fits"])
    return BenchRow(**data)
