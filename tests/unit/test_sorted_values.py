"""SortedValues.replace: the list a removal and an insertion would leave, whatever the
distance the value moves."""

from __future__ import annotations

import bisect
import random

import pytest

from antdt.services.monitor.windows import SortedValues


@pytest.mark.parametrize("seed", range(20))
def test_replace_leaves_the_list_a_removal_and_an_insertion_would(seed: int) -> None:
    rng = random.Random(seed)
    pool = [rng.choice([0.5, 1.0, 1.5]) if rng.random() < 0.3 else rng.random() for _ in range(50)]
    values, expected = SortedValues(), []
    for v in pool:
        values.replace(None, v)
        bisect.insort(expected, v)
    for _ in range(500):
        old = rng.choice(expected)
        new = rng.choice([old, rng.random(), rng.choice(expected), 0.5, 1.5, -1.0, 2.0])
        values.replace(old, new)
        del expected[bisect.bisect_left(expected, old)]
        bisect.insort(expected, new)
        assert list(values.values) == expected
    values.replace(expected[0], None)
    assert list(values.values) == expected[1:]


@pytest.mark.parametrize("seed", range(10))
def test_replace_keeps_every_bit_with_equal_values_and_signed_zeros(seed: int) -> None:
    """A value replaced by an equal one is not moved, unless a 0.0 of the other sign may
    be in the list (0.0 == -0.0): the same floats, bit for bit, as a removal and an
    insertion would leave."""
    rng = random.Random(seed)
    choices = [0.0, 0.0, 0.25, 0.25, rng.random()] + ([-0.0] if seed % 2 else [])
    values, expected = SortedValues(), []
    for _ in range(40):
        v = rng.choice(choices)
        values.replace(None, v)
        bisect.insort(expected, v)
    for _ in range(300):
        old = rng.choice(expected)
        new = rng.choice([old, old, rng.choice(choices)])
        values.replace(old, new)
        del expected[bisect.bisect_left(expected, old)]
        bisect.insort(expected, new)
        assert [repr(v) for v in values.values] == [repr(v) for v in expected]
