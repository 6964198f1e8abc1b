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


@pytest.mark.parametrize("seed", range(6))
def test_a_judge_renewing_most_ranks_at_once_holds_what_swaps_would(seed: int) -> None:
    """A renewal of most ranks' windows sorts the multisets afresh; one of a few swaps
    rank by rank: the same multisets, the same reference and verdicts either way."""
    from antdt.services.monitor import DetectorConfig
    from antdt.services.monitor.judge import Judge
    from antdt.services.monitor.reference import Evidence
    from antdt.services.monitor.windows import summarize

    rng, config = random.Random(seed), DetectorConfig()
    ranks = rng.choice((3, 16, 40))
    swapped, sorted_afresh = Judge(config), Judge(config)

    def stats(rank: int):  # type: ignore[no-untyped-def]
        rows = [(32, 0.03 * rng.uniform(0.9, 1.6), rng.choice((0.0, 0.002)), 0.004, 0.05)] * 8
        return summarize(rows, (), 0.0, config.reference)

    for _ in range(30):
        closing = rng.sample(range(ranks), rng.randint(1, ranks))
        windows = {r: (stats(r), rng.choice((None, 0.001, 0.002))) for r in closing}
        for rank, (window, link) in windows.items():
            sorted_afresh.queue(rank, window, link)
        sorted_afresh.renew()
        for rank, (window, link) in windows.items():
            swapped.queue(rank, window, link)
            swapped.renew()  # one at a time: swapped in
        for a, b in zip(vars(swapped).values(), vars(sorted_afresh).values(), strict=True):
            if isinstance(a, SortedValues):
                assert list(a.values) == list(b.values)
        assert swapped.reference() == sorted_afresh.reference()
        for rank, (window, link) in windows.items():
            verdicts = [
                j.judge(rank, window, Evidence(), 0.0, link) for j in (swapped, sorted_afresh)
            ]
            assert verdicts[0] == verdicts[1]


@pytest.mark.parametrize("seed", range(10))
def test_reset_from_an_array_holds_what_reset_from_values_does(seed: int) -> None:
    """NaN in the array is None in the values: left out; the rest sorted to the same
    floats, equal values and both zeros included, and medians read alike."""
    import math

    import numpy as np

    rng = random.Random(seed)
    drawn = [
        rng.choice([None, 0.0, -0.0, 0.25, 0.25, rng.random()]) for _ in range(rng.randint(0, 60))
    ]
    from_values, from_array = SortedValues(), SortedValues()
    from_values.reset(drawn)
    from_array.reset_array(np.array([math.nan if v is None else v for v in drawn]))
    assert [v.hex() for v in from_array.values] == [v.hex() for v in from_values.values]
    held = np.array([rng.choice([math.nan, *from_values.values]) for _ in range(8)] or [math.nan])
    alone = [from_values.median() if v != v else from_values.median_without(float(v)) for v in held]
    together = [None if v != v else v for v in from_array.medians_without(held).tolist()]
    assert together == alone
