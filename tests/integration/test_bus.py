"""The NATS seam against a real nats-server."""

from __future__ import annotations

import asyncio
import gzip
import json
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from structlog.testing import capture_logs

from antdt.runtime.bus import (
    Bus,
    BusError,
    Delivery,
    Rejected,
    RequestRefused,
    StreamMissing,
)
from antdt.schemas import (
    COMMAND_ADAPTER,
    ENCODING_HEADER,
    GZIP,
    Ack,
    AdjustBatch,
    ErrorCode,
    ErrorReply,
    Plan,
    PlanRequest,
    StepEvent,
    Subjects,
)
from tests.helpers import refusal, wait_for

pytestmark = pytest.mark.integration


def step_event(job: str = "job1", rank: int = 0, step: int = 1) -> StepEvent:
    return StepEvent(
        job=job,
        rank=rank,
        host="h0",
        step=step,
        epoch=0,
        plan_version=0,
        local_batch=8,
        samples=8,
        compute_s=0.1,
        data_wait_s=0.01,
        comm_s=0.02,
        step_s=0.14,
        started_at=100.0,
        ended_at=100.14,
    )


async def test_typed_publish_subscribe_and_rejections(bus: Bus) -> None:
    subjects = Subjects(bus.settings.subject_prefix)
    got: list[StepEvent] = []

    async def on_step(event: StepEvent, _: Delivery) -> None:
        got.append(event)

    await bus.subscribe(subjects.any_job("step.*"), StepEvent, on_step)
    await bus.publish(subjects.step("job1", 0), step_event())
    await bus.publish_raw(subjects.step("job1", 0), b"{not json")
    await bus.publish_raw(subjects.step("job1", 0), b'{"job": "job1", "unknown": 1}')
    bad = step_event().model_dump()
    bad["compute_s"] = -1.0
    await bus.publish_raw(subjects.step("job1", 0), json.dumps(bad).encode())
    await bus.publish_raw(subjects.step("job1", 0), b'{"compute_s": NaN}')
    await bus.publish_raw(subjects.step("job1", 0), b"x" * 300_000)
    await bus.publish(subjects.step("job1", 1), step_event(rank=1, step=2))
    await wait_for(lambda: len(got) == 2 and bus.rejections.total() == 5, what="2 ok, 5 rejected")
    assert [e.rank for e in got] == [0, 1]
    codes = {code for (_, code) in bus.rejections.counts}
    assert codes == {"bad_request", "too_large"}


async def test_request_reply_errors_and_union(bus: Bus) -> None:
    subjects = Subjects(bus.settings.subject_prefix)
    plan = Plan(job="j", version=3, local_batch=(4, 4), effective_step=10, created_at=1.0)

    async def on_cmd(cmd: object, delivery: Delivery) -> Ack:
        assert isinstance(cmd, AdjustBatch)
        if cmd.plan.version < 2:
            raise Rejected(ErrorCode.STALE, "plan version 1 is older than 2")
        return Ack(action_id=cmd.action_id, job="j", rank=0, ok=True, applied_step=10, at=2.0)

    await bus.subscribe(subjects.command("j", 0), COMMAND_ADAPTER, on_cmd, queue="agents")
    ack = await bus.request(
        subjects.command("j", 0), AdjustBatch(action_id="a1", job="j", plan=plan), Ack
    )
    assert ack.ok and ack.applied_step == 10
    old = plan.model_copy(update={"version": 1})
    with pytest.raises(RequestRefused) as refused:
        await bus.request(
            subjects.command("j", 0), AdjustBatch(action_id="a2", job="j", plan=old), Ack
        )
    assert refused.value.reply.code == "stale"
    raw = await refusal(bus, subjects.command("j", 0), b'{"kind": "explode"}', Ack)
    assert raw.code == "bad_request"
    with pytest.raises(BusError, match="no responder"):
        await bus.request(subjects.plan_get("nobody"), PlanRequest(job="j", rank=0), Plan)


async def test_each_request_gets_its_own_reply_and_a_silent_one_times_out(bus: Bus) -> None:
    prefix = bus.settings.subject_prefix
    arrived: list[object] = []

    async def reverse(msg: object) -> None:  # answers three requests, last first
        arrived.append(msg)
        if len(arrived) == 3:
            for held in reversed(arrived):
                await held.respond(b"re " + held.data)  # type: ignore[attr-defined]

    await bus.nc.subscribe(f"{prefix}.reverse", cb=reverse)
    silent: list[object] = []

    async def hold(msg: object) -> None:
        silent.append(msg)

    await bus.nc.subscribe(f"{prefix}.silent", cb=hold)
    replies = await asyncio.gather(
        *(bus.request_raw(f"{prefix}.reverse", str(i).encode(), timeout=5) for i in range(3))
    )
    assert replies == [b"re 0", b"re 1", b"re 2"]
    with pytest.raises(BusError, match="timed out"):
        await bus.request_raw(f"{prefix}.silent", b"x", timeout=0.2)
    await silent[0].respond(b"too late")  # dropped: nobody waits for it any more

    async def echo(msg: object) -> None:
        await msg.respond(msg.data)  # type: ignore[attr-defined]

    await bus.nc.subscribe(f"{prefix}.echo", cb=echo)
    assert await bus.request_raw(f"{prefix}.echo", b"after", timeout=5) == b"after"
    assert bus._inbox is not None and bus._inbox._waiting == {}  # nothing left waiting


async def test_handler_crash_is_contained(bus: Bus) -> None:
    subjects = Subjects(bus.settings.subject_prefix)

    async def broken(_: PlanRequest, __: Delivery) -> Plan:
        raise ZeroDivisionError

    await bus.subscribe(subjects.plan_get("j"), PlanRequest, broken)
    with pytest.raises(RequestRefused, match="internal"):
        await bus.request(subjects.plan_get("j"), PlanRequest(job="j", rank=0), Plan)
    with pytest.raises(RequestRefused, match="internal"):
        await bus.request(subjects.plan_get("j"), PlanRequest(job="j", rank=0), Plan)
    assert bus.handler_errors == 2


async def test_a_reply_over_max_payload_is_refused_as_too_large_not_dropped(
    bus: Bus,
    settings,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """A reply the server would refuse (a 100,000-rank plan on a 1 MiB server) reaches
    the requester as a TOO_LARGE error naming its size, not as a silent timeout."""
    subjects = Subjects(bus.settings.subject_prefix)
    server = await Bus(settings.nats, name="small-payload").connect()
    plan = Plan(job="big", version=1, local_batch=(8,) * 256, effective_step=0, created_at=1.0)

    async def answer(_: PlanRequest, __: Delivery) -> Plan:
        return plan

    try:
        await server.subscribe(subjects.plan_get("big"), PlanRequest, answer)
        monkeypatch.setattr(server.nc, "_max_payload", 300)  # as a server of 300 bytes says
        with pytest.raises(RequestRefused, match=r"Plan reply of \d+ bytes is over") as refused:
            await bus.request(subjects.plan_get("big"), PlanRequest(job="big", rank=0), Plan)
        assert refused.value.reply.code == ErrorCode.TOO_LARGE
    finally:
        await server.close()


async def test_a_reply_to_a_gzipped_request_does_not_say_gzip(bus: Bus) -> None:
    """Replies are never compressed (docs/contract.md): the request's Content-Encoding
    is not echoed with its other headers, or a client honouring it fails to inflate."""
    subjects = Subjects(bus.settings.subject_prefix)

    async def answer(request: PlanRequest, _: Delivery) -> Plan:
        return Plan(job=request.job, version=0, local_batch=(1,), effective_step=0, created_at=1.0)

    await bus.subscribe(subjects.plan_get("gz"), PlanRequest, answer)
    body = gzip.compress(PlanRequest(job="gz", rank=0).model_dump_json().encode())
    headers = {ENCODING_HEADER: GZIP, "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    reply = await bus.nc.request(subjects.plan_get("gz"), body, timeout=5, headers=headers)
    assert reply.headers is not None and ENCODING_HEADER not in reply.headers
    assert reply.headers["traceparent"] == headers["traceparent"]  # still echoed
    assert Plan.model_validate_json(reply.data).job == "gz"


async def test_concurrent_handlers_answer_at_once_or_after_waiting(bus: Bus) -> None:
    subjects = Subjects(bus.settings.subject_prefix)
    gate = asyncio.Event()

    async def handler(req: PlanRequest, _: Delivery) -> Plan:
        if req.rank == 1:  # waits: goes on as a task, answered once the gate opens
            await gate.wait()
        if req.rank == 2:  # a handler that cancels itself ends there, as a task would
            raise asyncio.CancelledError
        return Plan(job="j", version=req.rank, local_batch=(4,), effective_step=0, created_at=1.0)

    await bus.subscribe(subjects.plan_get("j"), PlanRequest, handler, concurrency=8)
    waiting = asyncio.ensure_future(
        bus.request(subjects.plan_get("j"), PlanRequest(job="j", rank=1), Plan, timeout=5)
    )
    now = await bus.request(subjects.plan_get("j"), PlanRequest(job="j", rank=0), Plan)
    assert now.version == 0 and not waiting.done()  # answered while rank 1's handler waits
    with pytest.raises(BusError, match="timed out"):
        await bus.request(subjects.plan_get("j"), PlanRequest(job="j", rank=2), Plan, timeout=0.3)
    gate.set()
    assert (await waiting).version == 1
    again = await bus.request(subjects.plan_get("j"), PlanRequest(job="j", rank=3), Plan)
    assert again.version == 3  # the subscription still delivers


async def test_replies_and_concurrent_handlers_are_delivered_straight_from_the_socket(
    bus: Bus,
) -> None:
    """A request's reply and a concurrent subscription's message reach their handler
    inside nats-py's read of the socket, not through the subscription's queue and task
    (delivery.py): this fails when the installed nats-py no longer has the internals that
    reaches into (they are then left alone, and every message takes the queue)."""
    subject = Subjects(bus.settings.subject_prefix).plan_get("direct")

    async def handler(req: PlanRequest, _: Delivery) -> Plan:
        return Plan(
            job="direct", version=req.rank, local_batch=(4,), effective_step=0, created_at=1.0
        )

    await bus.subscribe(subject, PlanRequest, handler, concurrency=4)
    before = bus.delivered_directly()
    for rank in range(10):
        reply = await bus.request(subject, PlanRequest(job="direct", rank=rank), Plan)
        assert reply.version == rank
    assert bus.delivered_directly() - before == 20  # ten requests, ten replies


async def test_queue_group_spreads_requests(bus: Bus, settings) -> None:  # type: ignore[no-untyped-def]
    subjects = Subjects(bus.settings.subject_prefix)
    other = await Bus(settings.nats, name="second").connect()
    served = {"a": 0, "b": 0}

    def responder(name: str):  # type: ignore[no-untyped-def]
        async def handle(req: PlanRequest, _: Delivery) -> ErrorReply:
            served[name] += 1
            return ErrorReply(error=name, code=ErrorCode.UNAVAILABLE)

        return handle

    await bus.subscribe(subjects.plan_get("q"), PlanRequest, responder("a"), queue="g")
    await other.subscribe(subjects.plan_get("q"), PlanRequest, responder("b"), queue="g")
    await other.flush()
    for _ in range(40):
        with pytest.raises(RequestRefused):
            await bus.request(subjects.plan_get("q"), PlanRequest(job="q", rank=0), Plan)
    assert served["a"] + served["b"] == 40 and served["a"] > 0 and served["b"] > 0
    await other.close()


async def test_a_subscription_with_concurrency_handles_that_many_at_once_and_drains(
    settings,  # type: ignore[no-untyped-def]
) -> None:
    """Handlers that wait on something shared (a ledger write) run side by side, at most
    `concurrency`; draining the bus still answers every request already taken."""
    server = await Bus(settings.nats, name="server").connect()
    client = await Bus(settings.nats, name="client").connect()
    subject = Subjects(settings.nats.subject_prefix).plan_get("job1")
    release, running, peak = asyncio.Event(), set[int](), 0

    async def slow(req: PlanRequest, _: Delivery) -> PlanRequest:
        nonlocal peak
        running.add(req.rank)
        peak = max(peak, len(running))
        await release.wait()
        await asyncio.sleep(0.2)  # still working when the drain has started
        running.discard(req.rank)
        return req  # echoed

    await server.subscribe(subject, PlanRequest, slow, concurrency=4)
    asking = [
        asyncio.ensure_future(
            client.request(subject, PlanRequest(job="job1", rank=r), PlanRequest, timeout=10)
        )
        for r in range(6)
    ]

    def four_running() -> bool:
        # A request that failed (no responder, a timeout) can never start its handler:
        # say so at once, and how, rather than time out on the count (it did once, in
        # a full `make test`, and never alone).
        failed = [f.exception() for f in asking if f.done() and f.exception() is not None]
        if failed:
            raise AssertionError(f"{len(failed)} request(s) failed, the first: {failed[0]!r}")
        return len(running) == 4

    try:
        try:
            await wait_for(four_running, what="four handlers at once")
        except AssertionError as exc:
            done = sum(f.done() for f in asking)
            raise AssertionError(f"{exc} ({len(running)} running, {done} of 6 answered)") from None
        await asyncio.sleep(0.1)
        assert peak == 4  # the other two wait for a slot
        draining = asyncio.ensure_future(server.drain())
        await asyncio.sleep(0.1)
        assert not draining.done()  # waits for the handlers it started
        release.set()
        await asyncio.wait_for(draining, 10)
        replies = await asyncio.gather(*asking)
        assert sorted(r.rank for r in replies) == list(range(6))
    finally:
        release.set()
        await client.close()
        await server.close()


async def test_subscribed_means_the_server_has_read_the_sub(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PING whose PONG confirms a subscription goes on the wire after its SUB.

    nats-py's flush writes its PING at once, ahead of a SUB still queued for its flusher
    task; the PONG then came back before the server had read the SUB, and a request from
    another connection found no responder (CI, once)."""
    written: list[bytes] = []
    transport = bus.nc._transport
    write, writelines = transport.write, transport.writelines

    def record(data: bytes) -> None:
        written.append(bytes(data))
        write(data)

    def record_lines(lines: list[bytes]) -> None:
        written.extend(bytes(line) for line in lines)
        writelines(lines)

    monkeypatch.setattr(transport, "write", record)
    monkeypatch.setattr(transport, "writelines", record_lines)
    subject = Subjects(bus.settings.subject_prefix).plan_get("job1")

    async def echo(req: PlanRequest, _: Delivery) -> PlanRequest:
        return req

    await bus.subscribe(subject, PlanRequest, echo)
    wire = b"".join(written)
    assert b"SUB " + subject.encode() in wire
    assert wire.index(b"SUB " + subject.encode()) < wire.rindex(b"PING")
    await bus.flush()  # the same for what is published
    await bus.publish_raw(subject, b"{}")
    await bus.flush()
    wire = b"".join(written)
    assert wire.rindex(b"PUB " + subject.encode()) < wire.rindex(b"PING")


async def test_messages_dropped_behind_a_slow_handler_are_counted_and_logged_once(
    bus: Bus,
) -> None:
    """A handler far behind fills its subscription's queue; nats-py drops what comes
    then. Every drop counts as a rejection (code slow_consumer), and one warning says so."""
    subject = Subjects(bus.settings.subject_prefix).step("job1", 0)
    release, handled = asyncio.Event(), []

    async def stuck(event: StepEvent, _: Delivery) -> None:
        await release.wait()
        handled.append(event.step)

    def dropped() -> int:
        return bus.rejections.counts[(subject, "slow_consumer")]

    await bus.subscribe(subject, StepEvent, stuck, pending_msgs=10)
    with capture_logs() as logs:
        for step in range(1, 51):
            await bus.publish(subject, step_event(step=step))
        await bus.flush()
        await wait_for(lambda: dropped() >= 30, what="drops counted")
        release.set()
        await wait_for(lambda: len(handled) + dropped() == 50, what="each handled or dropped")
    assert handled == sorted(handled) and handled[0] == 1  # the queue kept what it took
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [(e["event"], e["code"]) for e in warnings] == [("message rejected", "slow_consumer")]


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_a_backlog_drained_by_a_handler_leaves_the_loop_turns(
    bus: Bus, concurrency: int
) -> None:
    """nats-py hands queued messages to the handler without a loop turn in between. A
    backlog of 2,000 messages at 0.3 ms each holds the loop for 0.6 s unless the
    subscription gives turns (a monitor so lost its etcd lease): other tasks must run
    all through the drain, and every message is still handled, in order."""
    subject = Subjects(bus.settings.subject_prefix).step("backlog", 0)
    release, handled = asyncio.Event(), []

    async def slow(event: StepEvent, _: Delivery) -> None:
        if event.step < concurrency:
            await release.wait()  # every handler slot taken: the backlog builds up
        started = time.perf_counter()
        while time.perf_counter() - started < 0.0003:
            pass  # work that never waits, as a monitor ingesting a step event
        handled.append(event.step)

    await bus.subscribe(subject, StepEvent, slow, concurrency=concurrency)
    for step in range(2001):
        await bus.publish(subject, step_event(job="backlog", step=step))
    # Queued once read: nats-server may answer a flush's PING before it echoes them.
    await wait_for(lambda: bus.nc.stats["in_msgs"] >= 2001, what="every message read")
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while len(handled) < 2001:
            await asyncio.sleep(0)
            turns += 1

    started = time.perf_counter()
    release.set()
    await asyncio.wait_for(other_task(), timeout=30)
    drained_s = time.perf_counter() - started
    assert sorted(handled) == list(range(2001))
    assert [s for s in handled if s >= concurrency] == list(range(concurrency, 2001))
    # About one turn per 20 ms of handling; without turns, one at most (before or after).
    assert turns >= drained_s / 0.02 / 4, f"{turns} turns in {drained_s:.2f} s of draining"


async def test_a_subscription_ended_from_its_own_handler_finishes_what_was_queued(
    bus: Bus,
) -> None:
    """`Subscription.end()` from inside its handler (a job given up on one of its own
    events): the handler runs to its end, the messages queued behind it are still
    handled, nothing published after the end is, and the connection's other
    subscriptions go on."""
    subjects = Subjects(bus.settings.subject_prefix)
    got: list[int] = []
    finished: list[int] = []
    ended: list[asyncio.Task[None] | None] = []

    async def on_step(event: StepEvent, _: Delivery) -> None:
        got.append(event.step)
        if event.step == 3:
            ended.append(sub.end())
            ended.append(sub.end())  # idempotent
            await asyncio.sleep(0.05)  # a wait after the end: not cancelled
        finished.append(event.step)

    sub = await bus.subscribe(subjects.step("ends", "*"), StepEvent, on_step)
    other: list[int] = []

    async def on_other(event: StepEvent, _: Delivery) -> None:
        other.append(event.step)

    await bus.subscribe(subjects.step("stays", "*"), StepEvent, on_other)
    for n in range(1, 11):  # all queued before the handler reaches step 3
        await bus.publish(subjects.step("ends", 0), step_event("ends", 0, n))
    await bus.flush()
    await wait_for(lambda: len(ended) == 2, what="the end asked for")
    first, again = ended
    assert first is not None and again is None and sub.ended
    await asyncio.wait_for(first, timeout=10)
    assert got == finished  # every handler ran to its end
    assert got[:3] == [1, 2, 3] and got == sorted(got)
    handled = len(got)
    await bus.publish(subjects.step("ends", 0), step_event("ends", 0, 11))
    await bus.publish(subjects.step("stays", 0), step_event("stays", 0, 1))
    await wait_for(lambda: other == [1], what="the other subscription goes on")
    assert len(got) == handled and 11 not in got


async def test_trace_context_crosses_in_headers(bus: Bus) -> None:
    subjects = Subjects(bus.settings.subject_prefix)
    tracer = TracerProvider().get_tracer("test")
    seen: list[Delivery] = []
    ids: list[int] = []

    async def on_step(_: StepEvent, delivery: Delivery) -> None:
        seen.append(delivery)
        ids.append(trace.get_current_span().get_span_context().trace_id)

    await bus.subscribe(subjects.step("tr", 0), StepEvent, on_step)
    with tracer.start_as_current_span("publish") as span:
        await bus.publish(subjects.step("tr", 0), step_event(job="tr"))
        trace_id = span.get_span_context().trace_id
    await wait_for(lambda: seen, what="delivery")
    assert seen[0].headers["traceparent"].split("-")[1] == format(trace_id, "032x")
    assert ids == [trace_id]


async def test_jetstream_publish_dedup_and_replay(bus: Bus) -> None:
    subjects = Subjects(bus.settings.subject_prefix)
    stream = "T" + bus.settings.subject_prefix.replace(".", "_").upper()
    await bus.jetstream.ensure_stream(stream, [subjects.any_job("incident")], max_msgs=100)
    await bus.jetstream.ensure_stream(
        stream, [subjects.any_job("incident")], max_msgs=100
    )  # idempotent
    first = await bus.jetstream.publish(subjects.incident("j"), step_event(), msg_id="m1")
    again = await bus.jetstream.publish(subjects.incident("j"), step_event(), msg_id="m1")
    assert first == again
    await bus.jetstream.publish(subjects.incident("j"), step_event(step=2), msg_id="m2")
    replayed = await bus.jetstream.read(stream, subjects.incident("j"), StepEvent)
    assert [e.step for e in replayed.items] == [1, 2] and replayed.available == 2
    # From a start time on: what the server stored since then, not what came before.
    await asyncio.sleep(0.05)  # the server's timestamps of the two sides must differ
    since = time.time()
    await asyncio.sleep(0.05)
    await bus.jetstream.publish(subjects.incident("j"), step_event(step=3), msg_id="m3")
    later = await bus.jetstream.read(stream, subjects.incident("j"), StepEvent, since=since)
    assert [e.step for e in later.items] == [3] and later.available == 1


async def test_a_publish_no_stream_takes_is_refused_as_a_missing_stream(bus: Bus) -> None:
    subjects = Subjects(bus.settings.subject_prefix)
    with pytest.raises(StreamMissing, match="no stream takes"):
        await bus.jetstream.publish(subjects.incident("nowhere"), step_event(), timeout=1)


async def test_stored_messages_that_fail_validation_are_counted_and_logged(bus: Bus) -> None:
    """A bounded read and a read of the last message skip what fails validation, and
    count and log it as a subscription does."""
    subjects = Subjects(bus.settings.subject_prefix)
    stream = "B" + bus.settings.subject_prefix.replace(".", "_").upper()
    await bus.jetstream.ensure_stream(stream, [subjects.any_job("incident")], max_msgs=100)
    await bus.jetstream.publish(subjects.incident("j"), step_event(step=1))
    js = bus.nc.jetstream()
    for junk in (b"[" * 5000, b"\xff\xfe", b'{"step": NaN}'):
        await js.publish(subjects.incident("j"), junk)
    with capture_logs() as logs:
        read = await bus.jetstream.read(stream, subjects.incident("j"), StepEvent)
        last = await bus.jetstream.last(stream, subjects.incident("j"), StepEvent)
    assert [e.step for e in read.items] == [1] and read.rejected == 3 and last is None
    assert bus.rejections.total(f"{stream}:read") == 3
    assert bus.rejections.total(f"{stream}:last") == 1
    assert {e["code"] for e in logs if e["event"] == "message rejected"} == {"bad_request"}


async def test_a_bounded_read_tries_a_timed_out_fetch_again(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fetch that times out while the stream still holds the messages (the machine
    stalled) is tried again, rather than ending the read short; three in a row end it.
    nats-py's fetch raises the plain TimeoutError too: both count."""
    from nats.js.client import JetStreamContext

    subjects = Subjects(bus.settings.subject_prefix)
    stream = "R" + bus.settings.subject_prefix.replace(".", "_").upper()
    await bus.jetstream.ensure_stream(stream, [subjects.any_job("incident")], max_msgs=100)
    for n in range(5):
        await bus.jetstream.publish(subjects.incident("j"), step_event(step=n))
    real_fetch = JetStreamContext.PullSubscription.fetch
    stalls = {"left": 2}

    async def stalling_fetch(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if stalls["left"] > 0:
            stalls["left"] -= 1
            raise asyncio.TimeoutError
        return await real_fetch(self, *args, **kwargs)

    monkeypatch.setattr(JetStreamContext.PullSubscription, "fetch", stalling_fetch)
    read = await bus.jetstream.read(stream, subjects.incident("j"), StepEvent, batch=2)
    assert [e.step for e in read.items] == list(range(5)) and stalls["left"] == 0
    stalls["left"] = 3  # the server holds them but never delivers: the read gives up
    gave_up = await bus.jetstream.read(stream, subjects.incident("j"), StepEvent)
    assert gave_up.items == [] and gave_up.available == 5


async def test_reconnects_after_server_restart(tmp_path, unique) -> None:  # type: ignore[no-untyped-def]
    from antdt.runtime.config import NatsSettings
    from antdt.runtime.servers import EmbeddedNats

    server = EmbeddedNats(tmp_path / "n").start()
    bus = await Bus(NatsSettings(url=server.url, reconnect_wait_s=0.05), name="r").connect()
    got: list[StepEvent] = []

    async def on_step(event: StepEvent, _: Delivery) -> None:
        got.append(event)

    await bus.subscribe("x.step", StepEvent, on_step)
    server.kill()
    # Subscribed while the server is away: not confirmed (said in a warning), and the
    # subscription goes out when the connection is back.
    later: list[StepEvent] = []

    async def on_later(event: StepEvent, _: Delivery) -> None:
        later.append(event)

    with capture_logs() as logs:
        await bus.subscribe("x.later", StepEvent, on_later)
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [e["event"] for e in warnings] == ["subscription not confirmed by nats-server yet"]
    assert warnings[0]["subject"] == "x.later"
    server.start()
    await wait_for(lambda: bus.connected, timeout=15, what="reconnect")
    await asyncio.sleep(0)  # let the client re-send its subscriptions
    await wait_for(lambda: _publish_and_check(bus, "x.step", got), timeout=10, what="delivery")
    await wait_for(lambda: _publish_and_check(bus, "x.later", later), timeout=10, what="later")
    await bus.close()
    server.stop()


async def _publish_and_check(bus: Bus, subject: str, got: list[StepEvent]) -> bool:
    await bus.publish(subject, step_event())
    await asyncio.sleep(0.05)
    return bool(got)


async def test_first_connect_is_bounded() -> None:
    from antdt.runtime.config import NatsSettings
    from antdt.runtime.servers import free_port

    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(BusError, match="cannot connect"):
        await Bus(NatsSettings(url=url, connect_timeout_s=0.2), name="x").connect(retry_for_s=1)


async def test_streams_are_made_with_the_replicas_setting(settings, unique: str) -> None:
    """One replica on the session's single server; more are asked for on a cluster, and
    a single server refuses them in its own words."""
    subject = f"{settings.nats.subject_prefix}.replicas"
    for replicas, stream in ((1, f"R1_{unique}"), (3, f"R3_{unique}")):
        nats = settings.nats.model_copy(update={"stream_replicas": replicas})
        bus = await Bus(nats, name="replicas").connect()
        try:
            if replicas == 1:
                await bus.jetstream.ensure_stream(stream, [subject + ".one"])
                info = await bus.nc.jetstream().stream_info(stream)
                assert info.config.num_replicas == 1
                await bus.nc.jetstream().delete_stream(stream)
            else:
                with pytest.raises(Exception, match="replicas > 1 not supported"):
                    await bus.jetstream.ensure_stream(stream, [subject + ".three"])
        finally:
            await bus.close()
