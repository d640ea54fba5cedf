"""The benchmark store: one embedded SQLite file (stdlib :mod:`sqlite3`).

Each finished job is one row, written in its own transaction, so an interrupted
run leaves only whole rows behind; the primary key (instance, method, seed,
time_limit_s, version) lets a re-run skip what is done.  Only the parent process
writes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from pipette_cp.errors import InputFileError
from pipette_cp.suite.jobs import COLUMNS, CRASH, BenchRow

#: Default file name of the store.
DEFAULT_DB = "bench.sqlite"

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
}
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

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.exists():
            raise InputFileError(self.path, "no such file; run `pipette-cp bench` first")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, timeout=60)
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            tables = self._conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE type='table'"
            ).fetchone()[0]
            if tables and version != SCHEMA_VERSION:
                self._conn.close()
                raise InputFileError(
                    self.path,
                    f"not a pipette-cp bench store of schema version {SCHEMA_VERSION} "
                    f"(found {version}); use another --db",
                )
            # WAL: readers (a report, a test polling the file) never block the writer
            self._conn.execute("PRAGMA journal_mode=WAL")
            with self._conn:
                self._conn.execute(_CREATE)
                self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except (sqlite3.DatabaseError, OSError) as exc:
            raise InputFileError(self.path, f"cannot open as a SQLite store: {exc}") from None

    def __enter__(self) -> BenchStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def write(self, row: BenchRow) -> None:
        """Insert (or replace) one row in its own transaction."""
        values = [getattr(row, c) for c in COLUMNS]
        with self._conn:  # commits, or rolls back on error: never half a row
            self._conn.execute(_INSERT, values)

    def write_all(self, rows: Iterable[BenchRow]) -> None:
        for row in rows:
            self.write(row)

    def finished(self) -> set[tuple[Any, ...]]:
        """Keys of the jobs a re-run skips (every stored outcome but a crash)."""
        cursor = self._conn.execute(
            f"SELECT {', '.join(_KEY)} FROM results WHERE status != ?", (CRASH,)
        )
        return {tuple(r) for r in cursor}

    def rows(self) -> list[BenchRow]:
        """Every row, ordered by instance, method, seed, time limit, timestamp."""
        cursor = self._conn.execute(
            f"SELECT {', '.join(COLUMNS)} FROM results "
            "ORDER BY instance, method, seed, time_limit_s, timestamp"
        )
        return [_row(values) for values in cursor]


def _row(values: tuple[Any, ...]) -> BenchRow:
    data = dict(zip(COLUMNS, values, strict=True))
    if data["fits"] is not None:
        data["fits"] = bool(data["fits"])
    return BenchRow(**data)
