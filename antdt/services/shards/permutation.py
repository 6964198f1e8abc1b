"""A seeded O(1) permutation of range(n): the per-epoch shard order, never materialised. A
balanced Feistel network over the smallest 4^h >= n, cycle-walked into range(n), keyed by
a splitmix64 mix of (seed, epoch) (stable across processes and Python versions). Up to
2 * TABLE_HALF_BITS bits the round functions are tabled per (seed, epoch): the same
permutation, a few lookups per walk. Stored ledgers depend on it: it must never change."""

from __future__ import annotations

from functools import lru_cache

_MASK64 = (1 << 64) - 1
_ROUNDS = 4


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit mixing function."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@lru_cache(maxsize=256)
def _round_keys(seed: int, epoch: int) -> tuple[int, ...]:
    base = _mix64(_mix64(seed & _MASK64) ^ (epoch & _MASK64))
    return tuple(_mix64(base + r) for r in range(_ROUNDS))


#: Widest half (bits) whose round functions are tabled: 4 tables of 2^12 ints (about
#: 0.6 MB, built in about 12 ms once per epoch), for up to 4^12 (1.7 * 10^7) shards.
TABLE_HALF_BITS = 12


@lru_cache(maxsize=16)
def _round_tables(seed: int, epoch: int, half: int) -> tuple[tuple[int, ...], ...]:
    """Each round's function over every half-width input: table[r][x] is
    _mix64(x ^ keys[r]) masked to `half` bits, as _forward and _backward compute it."""
    mask = (1 << half) - 1
    return tuple(
        tuple(_mix64(x ^ key) & mask for x in range(1 << half)) for key in _round_keys(seed, epoch)
    )


def _walk_forward(index: int, n: int, half: int, tables: tuple[tuple[int, ...], ...]) -> int:
    mask = (1 << half) - 1
    x = index
    while True:
        left, right = x >> half, x & mask
        for table in tables:
            left, right = right, left ^ table[right]
        x = (left << half) | right
        if x < n:
            return x


def _walk_backward(shard: int, n: int, half: int, tables: tuple[tuple[int, ...], ...]) -> int:
    mask = (1 << half) - 1
    backwards = tables[::-1]
    x = shard
    while True:
        left, right = x >> half, x & mask
        for table in backwards:
            left, right = right ^ table[left], left
        x = (left << half) | right
        if x < n:
            return x


def _half_bits(n: int) -> int:
    return max(1, ((n - 1).bit_length() + 1) // 2)


def _forward(x: int, half: int, keys: tuple[int, ...]) -> int:
    mask = (1 << half) - 1
    left, right = x >> half, x & mask
    for key in keys:
        left, right = right, left ^ (_mix64(right ^ key) & mask)
    return (left << half) | right


def _backward(x: int, half: int, keys: tuple[int, ...]) -> int:
    mask = (1 << half) - 1
    left, right = x >> half, x & mask
    for key in reversed(keys):
        left, right = right ^ (_mix64(left ^ key) & mask), left
    return (left << half) | right


def _check(n: int, value: int, what: str) -> None:
    if n < 1:
        raise ValueError(f"a permutation needs n >= 1, got {n}")
    if not 0 <= value < n:
        raise ValueError(f"{what} {value} outside [0, {n})")


#: Positions of recently computed shards: a done report (often repeated, under
#: write-behind) asks for the position of a shard granted shortly before. Bounded.
_RECENT: dict[tuple[int, int, int, int], int] = {}
_RECENT_MAX = 1 << 16


def shard_at(seed: int, epoch: int, num_shards: int, index: int) -> int:
    """The shard at position `index` of epoch `epoch`'s order (a bijection of the range)."""
    _check(num_shards, index, "index")
    half = _half_bits(num_shards)
    if half <= TABLE_HALF_BITS:
        x = _walk_forward(index, num_shards, half, _round_tables(seed, epoch, half))
    else:
        keys = _round_keys(seed, epoch)
        x = _forward(index, half, keys)
        while x >= num_shards:
            x = _forward(x, half, keys)
    if len(_RECENT) >= _RECENT_MAX:
        _RECENT.clear()
    _RECENT[(seed, epoch, num_shards, x)] = index
    return x


def index_of(seed: int, epoch: int, num_shards: int, shard: int) -> int:
    """Inverse of shard_at: the position of `shard` in epoch `epoch`'s order."""
    known = _RECENT.get((seed, epoch, num_shards, shard))
    if known is not None:
        return known
    _check(num_shards, shard, "shard")
    half = _half_bits(num_shards)
    if half <= TABLE_HALF_BITS:
        return _walk_backward(shard, num_shards, half, _round_tables(seed, epoch, half))
    keys = _round_keys(seed, epoch)
    x = _backward(shard, half, keys)
    while x >= num_shards:
        x = _backward(x, half, keys)
    return x
