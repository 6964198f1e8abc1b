"""Every value AntDT reads back from etcd, decoded where the services decode it, from
arbitrary bytes and from mutations of a valid value: the typed value, or StoredValueInvalid,
counted (`antdt.store.values.rejected`) and logged. ANTDT_FUZZ_INPUTS sets the inputs
per decoder and strategy (`make chaos`: 100,000)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from antdt.runtime.store import StoredValueInvalid, decode_object, decode_stored, decode_text
from antdt.runtime.store.decoding import REJECTED
from antdt.schemas import (
    BlocklistEntry,
    JobHealth,
    JobSpec,
    NodeRecord,
    Plan,
    RankHello,
    RestartLedger,
)
from antdt.services.controller.blocklist import Blocklist
from antdt.services.monitor.jobconfig import read_spec
from antdt.services.shards.state import LedgerState, new_ledger
from tests.unit.fuzzing import FUZZ, INPUTS, RAW, batches, corpus, mutations, seed

#: Every model a service reads from etcd (JobHealth: a job's `ended` record).
MODELS: dict[str, Any] = {
    m.__name__: m
    for m in (JobSpec, Plan, RestartLedger, BlocklistEntry, NodeRecord, RankHello, JobHealth)
}
MODELS["LedgerState"] = LedgerState


def valid(name: str) -> Any:
    if name == "LedgerState":  # its invariants tie fields together: a real ledger
        spec = JobSpec(job="j", world_size=2, dataset_size=100, shard_size=10, global_batch=8)
        return new_ledger(spec).model_dump(mode="json")
    return seed(MODELS[name])


def checked(kind: str, decode: Callable[[bytes], Any]) -> Callable[[bytes], None]:
    """`decode` held to the boundary's contract: a value, or one counted StoredValueInvalid."""

    def check(data: bytes) -> None:
        before = REJECTED[kind]
        try:
            decode(data)
        except StoredValueInvalid as exc:
            assert exc.kind == kind and exc.reason
            assert REJECTED[kind] == before + 1
        else:
            assert REJECTED[kind] == before

    return check


def fuzz(kind: str, strategy: st.SearchStrategy[bytes], decode: Callable[[bytes], Any]) -> None:
    check = checked(kind, decode)
    before = REJECTED[kind]
    fed = 0
    with capture_logs() as logs:

        @FUZZ
        @given(batches(strategy))
        def feed(inputs: list[bytes]) -> None:
            nonlocal fed
            for data in inputs:
                check(data)
            fed += len(inputs)

        feed()
    assert fed >= INPUTS
    if REJECTED[kind] > before:  # the 1st, 2nd, 4th... of a type are logged: at least one
        assert any(e["event"] == "stored value rejected" and e["kind"] == kind for e in logs)


def model_decoder(name: str) -> Callable[[bytes], Any]:
    return lambda data: decode_stored(f"/antdt/v1/fuzz/{name}", data, MODELS[name])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_stored_models_from_arbitrary_bytes(name: str) -> None:
    fuzz(name, RAW, model_decoder(name))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_stored_models_from_mutated_values(name: str) -> None:
    fuzz(name, mutations(valid(name)), model_decoder(name))


def test_owner_ids_from_arbitrary_bytes() -> None:
    fuzz("text", st.binary(max_size=256), lambda data: decode_text("/owners/shards/j", data))


def test_json_objects_from_arbitrary_and_mutated_bytes() -> None:
    ledger = valid("LedgerState")
    fuzz("object", st.one_of(RAW, mutations(ledger)), lambda d: decode_object("/ledger", d))


def test_the_monitors_spec_reader_never_raises() -> None:
    """read_spec salvages a spec whose monitor section is bad, else says why it cannot."""

    @FUZZ
    @given(batches(st.one_of(RAW, mutations(seed(JobSpec, {"monitor": {"window": 8}})))))
    def read(inputs: list[bytes]) -> None:
        for data in inputs:
            spec, problem = read_spec(data, "/jobs/j/spec")
            assert spec is not None or problem

    read()


def test_the_blocklist_follower_blocks_a_host_whose_entry_is_unreadable() -> None:
    blocklist = Blocklist()

    @FUZZ
    @given(batches(st.one_of(RAW, mutations(seed(BlocklistEntry)))))
    def apply(inputs: list[bytes]) -> None:
        for data in inputs:
            blocklist.apply("h1", data, 7)
            assert "h1" in blocklist.entries

    apply()


@pytest.mark.parametrize("path", corpus(), ids=lambda p: p.name)
def test_past_crashes_are_refused_by_every_stored_value_decoder(path: Path) -> None:
    data = path.read_bytes()
    for name in MODELS:
        with pytest.raises(StoredValueInvalid):
            model_decoder(name)(data)
    for decode in (lambda d: decode_object("/k", d), lambda d: decode_text("/k", d + b"\xff")):
        with pytest.raises(StoredValueInvalid):
            decode(data)
    assert read_spec(data, "/jobs/j/spec")[0] is None
