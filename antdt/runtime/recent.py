"""A bounded map that forgets its least recently set entries: for what a service keeps
per job or per incident id, where the ids come off the wire and must not grow memory."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

V = TypeVar("V")


class Recent(Generic[V]):
    """At most `limit` entries; `put` makes an entry the most recent one."""

    def __init__(self, limit: int) -> None:
        self._items: OrderedDict[str, V] = OrderedDict()
        self.limit = limit

    def get(self, key: str) -> V | None:
        return self._items.get(key)

    def __getitem__(self, key: str) -> V:
        return self._items[key]

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def put(self, key: str, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def pop(self, key: str) -> V | None:
        return self._items.pop(key, None)
