"""The stored ledger's long lists as columns of numbers: about 20 bytes an entry instead of
52 as JSON objects, so that a large job's ledger stays under etcd's request limit.
Reading accepts both forms (objects are still found in etcd and in snapshots); Python-mode
dumps keep the objects."""

from __future__ import annotations

from collections.abc import Iterator
from operator import attrgetter
from typing import Any, NamedTuple

from pydantic import BeforeValidator, PlainSerializer


class Columns(NamedTuple):
    """Field metadata: `Annotated[tuple[Model, ...], columns.read, columns.write]`."""

    read: BeforeValidator
    write: PlainSerializer


def entry_columns(names: tuple[str, ...]) -> Columns:
    """A tuple of models stored as {name: [values]} for each of `names`."""
    getters = [(name, attrgetter(name)) for name in names]

    def to_columns(entries: tuple[Any, ...]) -> Any:
        # A column at a time: transposing rows would allocate a tuple per entry.
        return {name: list(map(get, entries)) for name, get in getters} if entries else []

    def from_columns(value: Any) -> Any:
        if not isinstance(value, dict):
            return value  # a list of objects: pydantic validates it as it is
        return [dict(zip(names, row, strict=True)) for row in _rows(value, names)]

    return Columns(BeforeValidator(from_columns), PlainSerializer(to_columns, when_used="json"))


#: A checkpoint's commits as columns: one row per commit (its rank and how many entries
#: it held), and the held entries of all commits, in commit order, in three more.
_COMMIT = ("rank", "held")
_HELD = ("shard", "attempt", "position")


def commit_columns() -> Columns:
    """A tuple of RankCommit (each: `rank`, and `held` entries of that rank) stored as
    columns. An entry's rank is its commit's, so it is not repeated."""
    held_getters = [(name, attrgetter(name)) for name in _HELD]

    def to_columns(commits: tuple[Any, ...]) -> Any:
        if not commits:
            return []
        held = [entry for commit in commits for entry in commit.held]
        columns: dict[str, list[int]] = {
            "rank": [commit.rank for commit in commits],
            "held": [len(commit.held) for commit in commits],
        }
        columns.update((name, list(map(get, held))) for name, get in held_getters)
        return columns

    def from_columns(value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        if set(value) != {*_COMMIT, *_HELD}:
            raise ValueError(f"commit columns must be {_COMMIT + _HELD}, got {sorted(value)}")
        commits = _rows({k: value[k] for k in _COMMIT}, _COMMIT)
        entries = _rows({k: value[k] for k in _HELD}, _HELD)
        out = []
        for rank, count in commits:
            if not isinstance(count, int) or count < 0:
                raise ValueError(f"commit of rank {rank}: held count {count!r}")
            held = []
            for _ in range(count):
                row = next(entries, None)
                if row is None:
                    raise ValueError("fewer held entries than the commits' counts")
                held.append({**dict(zip(_HELD, row, strict=True)), "rank": rank})
            out.append({"rank": rank, "held": held})
        if next(entries, None) is not None:
            raise ValueError("more held entries than the commits' counts")
        return out

    return Columns(BeforeValidator(from_columns), PlainSerializer(to_columns, when_used="json"))


def _rows(columns: dict[str, Any], names: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
    if set(columns) != set(names):
        raise ValueError(f"columns must be {names}, got {sorted(columns)}")
    lists = [columns[name] for name in names]
    if not all(isinstance(column, list) for column in lists):
        raise ValueError(f"each of the columns {names} must be a list")
    if len({len(column) for column in lists}) > 1:
        raise ValueError(f"columns {names} of different lengths")
    return zip(*lists, strict=True)
