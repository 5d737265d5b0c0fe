"""A bounded, thread-safe least-recently-used map for results of pure functions.

Keys are digests of a computation's inputs, so a cache holds no inputs alive and a
hit is exactly the value the computation would return again. Only immutable
values (frozen dataclasses, tuples) belong in it: callers share them.
"""
from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
_MISSING = object()


class Memo(Generic[K, V]):
    """At most `maxsize` entries; the least recently used goes first."""

    def __init__(self, maxsize: int):
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.maxsize = maxsize
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: K, compute: Callable[[], V], fresh: Callable[[V], bool] | None = None) -> V:
        """The value stored under `key`, else `compute()` (stored; not under the lock). A stored value
        that `fresh` says is no longer valid (time-bound results) is computed again."""
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is not _MISSING and (fresh is None or fresh(value)):  # type: ignore[arg-type]
                self._data.move_to_end(key)
                self.hits += 1
                return value  # type: ignore[return-value]
            self.misses += 1
        return self.put(key, compute())

    def peek(self, key: K) -> V | None:
        """The value stored under `key` (now the most recently used), None when there is none."""
        with self._lock:
            value = self._data.get(key, _MISSING)
            if value is _MISSING:
                return None
            self._data.move_to_end(key)
            return value  # type: ignore[return-value]

    def put(self, key: K, value: V) -> V:
        """Store `value` under `key` (the least recently used dropped beyond `maxsize`); returns it."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0


class OnceSlots:
    """Base of a slotted frozen dataclass that keeps one value computed once per object in its `_once`
    slot (`functools.cached_property` needs an instance `__dict__`, which costs far more per object).
    The slot is not a field: repr, equality, hashing, pickling and `dataclasses.replace` ignore it."""

    __slots__ = ("_once",)

    def _once_or(self, compute: Callable[[], str]) -> str:
        """The value kept in `_once`, computed (and kept) on the first call."""
        return self._kept("_once", compute)

    def _kept(self, slot: str, compute: Callable[[], Any]) -> Any:
        """The value kept in `slot` (one a subclass declares, or `_once`), computed on the first call."""
        try:
            return getattr(self, slot)
        except AttributeError:
            value = compute()
            object.__setattr__(self, slot, value)
            return value


class ContentDigested(OnceSlots):
    """Base of a slotted frozen dataclass whose `content_digest` (of its repr) is taken once per object:
    compiled and observed values are reused from plan to plan, and memos key on the digest."""

    __slots__ = ()

    @property
    def content_digest(self) -> str:
        return self._once_or(lambda: content_digest(self))


def content_digest(value: object) -> str:
    """A digest of a dataclass value's repr (which shows every field): for values computed once and
    reused, such as compiled or observed pods, so a digest is taken once per object."""
    return hashlib.sha256(repr(value).encode()).hexdigest()


def key_of(*parts: str | None) -> bytes:
    """A digest of `parts`: each is length-prefixed, so none can run into the next; None and "" differ."""
    text = "".join(["~" if part is None else f"{len(part)}:{part}" for part in parts])
    return hashlib.sha256(text.encode()).digest()
