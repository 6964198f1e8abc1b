"""A step judged at its planned batch in one pass, when work sharing ran it otherwise.

Under work sharing a rank computes its share in micro-batches when it offers it, and
micro-batches of other ranks' shares when it helps: its step's samples differ from its
plan's, and each pass pays the model's fixed cost. Judged raw, such steps make a
straggler's speed model jump between batch sizes (one fitted on 24 samples in three
passes called a 3x straggler 6x slow) and a helper look slow for its extra passes. The
agent reports what its planned batch would take in one pass at its pace in the step
(`StepEvent.one_piece_s`); the detector judges the step as that step."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: Indices in a step's fields (StepFields order) that this module reads.
LOCAL_BATCH, SAMPLES, COMPUTE_S, ONE_PIECE_S = 5, 8, 9, 15


def acceptable_one_piece(value: object, max_s: float) -> bool:
    """Whether `value` may be a step's one-piece time: None, or a number in [0, max_s]."""
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and 0.0 <= value <= max_s


def bad_one_piece(fields: Sequence[Any], max_s: float) -> bool:
    """Whether the fields carry a one-piece time that is not `acceptable_one_piece`."""
    return len(fields) > ONE_PIECE_S and not acceptable_one_piece(fields[ONE_PIECE_S], max_s)


def in_one_piece(fields: Sequence[Any]) -> Sequence[Any]:
    """`fields` with its samples and compute time those of the rank's planned batch in
    one pass (`one_piece_s`); the same fields when they carry none, or the plan gave
    the rank no samples (a rank that only helps is judged on what it computed)."""
    if len(fields) <= ONE_PIECE_S or fields[ONE_PIECE_S] is None:
        return fields
    planned, one_piece_s = fields[LOCAL_BATCH], fields[ONE_PIECE_S]
    if not judged_in_one_piece(planned, one_piece_s):
        return fields
    return (*fields[:SAMPLES], planned, one_piece_s, *fields[COMPUTE_S + 1 : ONE_PIECE_S], None)


def judged_in_one_piece(planned: int, one_piece_s: float | None) -> bool:
    """Whether a step is judged as its planned batch (`planned` samples) in `one_piece_s`
    rather than as it ran: a one-piece time was given and both are above 0."""
    return one_piece_s is not None and planned > 0 and one_piece_s > 0


__all__ = [
    "ONE_PIECE_S",
    "acceptable_one_piece",
    "bad_one_piece",
    "in_one_piece",
    "judged_in_one_piece",
]
