"""JobHealth's ranks as columns: the wire form (golden), its checks, the rows it reads as,
and the row form of earlier senders, still accepted."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from antdt.schemas import JobHealth, RankColumns, RankHealth, RankState


def row(rank: int, **changes: object) -> RankHealth:
    fields: dict[str, object] = {
        "rank": rank,
        "host": f"node{rank}",
        "state": RankState.OK,
        "last_step": 40,
        "local_batch": 32,
        "samples_per_s": 1000.0 + rank,
        "compute_s_per_sample": 0.001,
        "ratio": 1.0,
        "data_wait_share": 0.01,
        "comm_share": 0.2,
        "fixed_s": 0.002,
        "per_sample_s": 0.001,
    }
    return RankHealth.model_validate({**fields, **changes})


def health(rows: list[RankHealth] | tuple[RankHealth, ...]) -> JobHealth:
    return JobHealth(
        job="j",
        at=1.0,
        step=40,
        step_s=0.05,
        samples_per_s=2000.0,
        balance_efficiency=0.9,
        plan_version=2,
        ranks=rows,
    )


ROWS = (
    row(0),
    row(1, state=RankState.SLOW, ratio=2.5, fixed_s=None, per_sample_s=None, helped={0: 8}),
)


def test_the_wire_form_is_one_list_per_figure() -> None:
    """Golden: the order and names of the columns never change without a new contract."""
    wire = json.loads(health(ROWS).model_dump_json())
    assert wire["ranks"] == {
        "schema_version": 1,
        "rank": [0, 1],
        "host": ["node0", "node1"],
        "state": ["ok", "slow"],
        "last_step": [40, 40],
        "local_batch": [32, 32],
        "samples_per_s": [1000.0, 1001.0],
        "compute_s_per_sample": [0.001, 0.001],
        "ratio": [1.0, 2.5],
        "data_wait_share": [0.01, 0.01],
        "comm_share": [0.2, 0.2],
        "fixed_s": [0.002, None],
        "per_sample_s": [0.001, None],
        "helped": {"1": {"0": 8}},
    }


def test_the_columns_read_back_as_the_rows_they_were_made_of() -> None:
    sent = health(ROWS)
    back = JobHealth.model_validate_json(sent.model_dump_json())
    assert back == sent and len(back.ranks) == 2 and bool(back.ranks)
    assert list(back.ranks) == list(ROWS) and back.ranks[-1] == ROWS[1]
    assert back.ranks.state == (RankState.OK, RankState.SLOW)
    with pytest.raises(TypeError):
        back.ranks[0:1]  # type: ignore[index]  # a row at a time


def test_the_row_form_of_earlier_senders_is_read_as_columns() -> None:
    """A monitor of before the columns sent a list of row objects: still accepted."""
    old = {**json.loads(health(()).model_dump_json()), "ranks": [r.model_dump() for r in ROWS]}
    got = JobHealth.model_validate_json(json.dumps(old))
    assert got.ranks == RankColumns.of_rows(ROWS) and got == health(ROWS)


def test_no_ranks_is_a_health_of_none() -> None:
    empty = health(())
    assert not empty.ranks and list(empty.ranks) == []
    assert JobHealth.model_validate_json(empty.model_dump_json()) == empty


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"host": ["a"]}, "one entry per rank"),
        ({"ratio": [1.0, 1.0, 1.0]}, "one entry per rank"),
        ({"helped": {"5": {"0": 1}}}, "helped names a rank"),
        ({"rank": [1, 1]}, "more than one entry"),
        ({"rank": list(range(100_001))}, "at most 100000 items"),
        ({"comm_share": [0.2, 1.5]}, "less than or equal to 1"),
        ({"samples_per_s": [1.0, -1.0]}, "greater than or equal to 0"),
        ({"state": ["ok", "tired"]}, "ok', 'slow'"),
        ({"rank": [0, -1]}, "greater than or equal to 0"),
        ({"fixed_s": [0.1, float("nan")]}, "finite"),
        ({"extra": [1, 2]}, "Extra inputs are not permitted"),
    ],
)
def test_bad_columns_are_refused_with_the_reason(change: dict[str, object], error: str) -> None:
    wire = json.loads(health(ROWS).model_dump_json())
    wire["ranks"].update(change)
    with pytest.raises(ValidationError, match=error):
        JobHealth.model_validate_json(json.dumps(wire).replace("NaN", '"nan"'))
