"""A job's life in a monitor replica (lifecycle.py), decision by decision: the phase and
the answer each event gets, and whole lives in order (golden)."""

from __future__ import annotations

import pytest

from antdt.schemas import JobHealth
from antdt.services.monitor import lifecycle
from antdt.services.monitor.detector import JobDetector
from antdt.services.monitor.lifecycle import (
    ENDED_GRACE_S,
    Admission,
    Chore,
    EndFound,
    Greeting,
    JobBook,
    JobPhase,
)

JOB = "j"
SUBJECTS = ("p.j.step.0", "p.j.step.1")


def _book(phase: JobPhase, now: float = 100.0) -> JobBook:
    """A book with JOB in `phase`, as the decisions put it there (at `now`)."""
    book = JobBook()
    if phase is JobPhase.IDLE:
        book.record(JOB)
    elif phase is JobPhase.ENDED:
        _watch(book, now)
        lifecycle.ended(book, JOB, 10, now, abandoned=False)
        lifecycle.forget(book, JOB, now)  # its end recorded, given up
    elif phase is JobPhase.DORMANT:
        _watch(book, now)
        lifecycle.ended(book, JOB, 10, now, abandoned=True)
        lifecycle.forget(book, JOB, now)
    else:
        lifecycle.claimed(book, JOB, now)
        if phase is JobPhase.STARTING:
            assert lifecycle.hold_starting(book, JOB, now)
        elif phase is JobPhase.WATCHED:
            _watch(book, now)
    assert book.phase(JOB) is phase
    return book


def _watch(book: JobBook, now: float) -> None:
    lifecycle.claimed(book, JOB, now)
    lifecycle.watched(book, JOB, JobDetector(JOB, 2), SUBJECTS, now)


# (phase, owned, exit, step, seconds after the setup) -> (admission, phase after)
ADMISSIONS = [
    (JobPhase.WATCHED, True, False, 11, 0.0, Admission.INGEST, JobPhase.WATCHED),
    (JobPhase.WATCHED, False, False, 11, 0.0, Admission.NOT_OURS, JobPhase.WATCHED),
    (JobPhase.WATCHED, True, True, 11, 0.0, Admission.INGEST, JobPhase.WATCHED),
    (JobPhase.IDLE, False, False, 1, 0.0, Admission.NOT_OURS, JobPhase.IDLE),
    (JobPhase.IDLE, False, True, 1, 0.0, Admission.TAKE_ON, JobPhase.IDLE),
    (JobPhase.CLAIMED, True, False, 1, 0.0, Admission.TAKE_ON, JobPhase.CLAIMED),
    (JobPhase.STARTING, True, False, 1, 0.0, Admission.TAKE_ON, JobPhase.STARTING),
    # An ended job: late events (not past its last step, within the grace) are dropped.
    (JobPhase.ENDED, False, False, 10, 1.0, Admission.NOT_OURS, JobPhase.ENDED),
    (JobPhase.ENDED, False, True, 10, 1.0, Admission.LATE, JobPhase.ENDED),
    (JobPhase.ENDED, False, True, 11, 1.0, Admission.TAKE_ON, JobPhase.IDLE),
    (JobPhase.ENDED, False, True, 3, ENDED_GRACE_S, Admission.TAKE_ON, JobPhase.IDLE),
    # A dormant job's steps are its own: late within the grace, else they take it on.
    (JobPhase.DORMANT, False, False, 10, 1.0, Admission.LATE, JobPhase.DORMANT),
    (JobPhase.DORMANT, False, False, 11, 1.0, Admission.TAKE_ON, JobPhase.DORMANT),
    (JobPhase.DORMANT, False, False, 3, ENDED_GRACE_S, Admission.TAKE_ON, JobPhase.DORMANT),
]


@pytest.mark.parametrize(("phase", "owned", "exit", "step", "later", "answer", "after"), ADMISSIONS)
def test_admit_answers_each_event_by_the_jobs_phase(
    phase: JobPhase,
    owned: bool,
    exit: bool,
    step: int,
    later: float,
    answer: Admission,
    after: JobPhase,
) -> None:
    book = _book(phase)
    assert lifecycle.admit(book, JOB, step, 100.0 + later, owned=owned, claims=exit) is answer
    assert book.phase(JOB) is after


def test_admit_of_a_job_never_seen_makes_no_record() -> None:
    book = JobBook()
    assert lifecycle.admit(book, JOB, 1, 0.0, owned=False) is Admission.NOT_OURS
    assert lifecycle.admit(book, JOB, 1, 0.0, owned=True) is Admission.TAKE_ON
    assert len(book) == 0


@pytest.mark.parametrize(
    ("phase", "owned", "answer", "after"),
    [
        (JobPhase.WATCHED, True, Greeting.RANK_STARTED, JobPhase.WATCHED),
        (JobPhase.WATCHED, False, Greeting.CLAIM, JobPhase.WATCHED),
        (JobPhase.CLAIMED, True, Greeting.NOTHING, JobPhase.CLAIMED),
        (JobPhase.IDLE, False, Greeting.CLAIM, JobPhase.IDLE),
        (JobPhase.ENDED, False, Greeting.CLAIM, JobPhase.IDLE),  # a new run
        (JobPhase.DORMANT, False, Greeting.CLAIM, JobPhase.DORMANT),
    ],
)
def test_a_hello_starts_a_new_run(
    phase: JobPhase, owned: bool, answer: Greeting, after: JobPhase
) -> None:
    book = _book(phase)
    assert lifecycle.greet(book, JOB, 101.0, owned=owned) is answer
    assert book.phase(JOB) is after
    # Its earlier end no longer makes its steps late.
    assert lifecycle.admit(book, JOB, 1, 101.0, owned=False, claims=True) is not Admission.LATE


def test_a_jobs_life_from_its_first_hello_to_its_end_golden() -> None:
    book, phases = JobBook(), []

    def seen() -> None:
        phases.append(book.phase(JOB).value)

    assert lifecycle.greet(book, JOB, 0.0, owned=False) is Greeting.CLAIM
    lifecycle.claimed(book, JOB, 0.0)
    seen()
    assert lifecycle.hold_starting(book, JOB, 0.0)
    seen()
    assert not lifecycle.registered(book, JOB, 1.0, found=False)
    seen()
    assert not lifecycle.registered(book, JOB, 2.0, found=True)
    seen()
    assert lifecycle.admit(book, JOB, 0, 3.0, owned=True) is Admission.TAKE_ON
    lifecycle.watched(book, JOB, JobDetector(JOB, 2), SUBJECTS, 3.0)
    seen()
    assert lifecycle.admit(book, JOB, 1, 4.0, owned=True) is Admission.INGEST
    lifecycle.ended(book, JOB, 7, 5.0, abandoned=False)
    seen()
    lifecycle.forget(book, JOB, 5.0)  # given up once its end is recorded
    seen()
    assert lifecycle.admit(book, JOB, 7, 6.0, owned=False, claims=True) is Admission.LATE
    assert lifecycle.greet(book, JOB, 20.0, owned=False) is Greeting.CLAIM
    seen()
    golden = ["claimed", "starting", "starting", "claimed", "watched", "ended", "ended", "idle"]
    assert phases == golden


def test_an_abandoned_job_stays_dormant_and_a_step_past_its_end_takes_it_on_golden() -> None:
    book, phases = _book(JobPhase.WATCHED, now=0.0), []
    lifecycle.ended(book, JOB, 10, 50.0, abandoned=True)
    phases.append(book.phase(JOB))
    lifecycle.forget(book, JOB, 50.0)  # given up: another replica may claim it
    phases.append(book.phase(JOB))
    assert lifecycle.admit(book, JOB, 10, 51.0, owned=False) is Admission.LATE
    assert lifecycle.admit(book, JOB, 11, 52.0, owned=False) is Admission.TAKE_ON
    lifecycle.claimed(book, JOB, 52.0)
    phases.append(book.phase(JOB))  # still dormant while it is taken on
    assert lifecycle.end_found(book, JOB, 10, 11, 52.5) is EndFound.REVIVE
    lifecycle.watched(book, JOB, JobDetector(JOB, 2), SUBJECTS, 53.0)
    phases.append(book.phase(JOB))
    assert phases == [JobPhase.DORMANT, JobPhase.DORMANT, JobPhase.DORMANT, JobPhase.WATCHED]
    record = book.get(JOB)
    assert record is not None and record.abandoned_at is None


@pytest.mark.parametrize(
    ("ended_step", "step", "answer", "after"),
    [
        (10, 11, EndFound.REVIVE, JobPhase.CLAIMED),
        (10, 10, EndFound.ENDED, JobPhase.ENDED),
        (10, None, EndFound.ENDED, JobPhase.ENDED),  # taken on by no event (abandoning)
        (None, 10**9, EndFound.ENDED, JobPhase.ENDED),  # unreadable: every event is late
    ],
)
def test_an_end_found_in_etcd_ends_the_job_unless_a_step_is_past_it(
    ended_step: int | None, step: int | None, answer: EndFound, after: JobPhase
) -> None:
    book = _book(JobPhase.CLAIMED)
    assert lifecycle.end_found(book, JOB, ended_step, step, 101.0) is answer
    assert book.phase(JOB) is after
    if answer is EndFound.ENDED:
        admission = lifecycle.admit(book, JOB, 10, 102.0, owned=False, claims=True)
        assert admission is Admission.LATE


def test_an_end_found_for_a_dormant_job_keeps_it_dormant() -> None:
    book = _book(JobPhase.DORMANT)
    assert lifecycle.end_found(book, JOB, 10, 5, 200.0) is EndFound.ENDED
    assert book.phase(JOB) is JobPhase.DORMANT


@pytest.mark.parametrize(
    ("phase", "after"),
    [
        (JobPhase.WATCHED, JobPhase.IDLE),
        (JobPhase.CLAIMED, JobPhase.IDLE),
        (JobPhase.STARTING, JobPhase.IDLE),
        (JobPhase.ENDED, JobPhase.ENDED),
        (JobPhase.DORMANT, JobPhase.DORMANT),
    ],
)
def test_forgetting_a_job_drops_its_detector_and_keeps_its_end(
    phase: JobPhase, after: JobPhase
) -> None:
    book = _book(phase)
    lifecycle.forget(book, JOB, 101.0)
    record = book.record(JOB)
    assert book.phase(JOB) is after and record.detector is None and record.subjects == ()
    assert record.unwatched_since is None and JOB not in book.detectors()


def test_a_starting_job_is_given_up_after_register_wait_and_starting_ones_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lifecycle, "MAX_STARTING", 2)
    book = JobBook()
    held = []
    for job in ("a", "b", "c"):
        lifecycle.claimed(book, job, 0.0)
        held.append(lifecycle.hold_starting(book, job, 0.0))
    assert held == [True, True, False]
    assert book.jobs(JobPhase.STARTING) == ["a", "b"]
    wait = lifecycle.REGISTER_WAIT_S
    assert not lifecycle.registered(book, "a", wait - 0.1, found=False)
    assert lifecycle.registered(book, "a", wait, found=False)  # give it up
    assert not lifecycle.registered(book, "b", wait, found=True)
    assert [book.phase(j) for j in "abc"] == [JobPhase.IDLE, JobPhase.CLAIMED, JobPhase.CLAIMED]


def test_the_tick_lists_its_chores_in_order_golden() -> None:
    book = JobBook()
    for job in ("w1", "w2", "lost"):
        lifecycle.claimed(book, job, 0.0)
        lifecycle.watched(book, job, JobDetector(job, 1), (f"p.{job}.step.0",), 0.0)
    lifecycle.claimed(book, "silent", 0.0)
    lifecycle.claimed(book, "young", 50.0)
    lifecycle.claimed(book, "starting", 0.0)
    assert lifecycle.hold_starting(book, "starting", 0.0)
    lifecycle.claimed(book, "gone", 0.0)  # its key went without a word (released)
    owned = {"w1", "w2", "silent", "young", "starting", "later"}  # "later": claimed elsewhere
    chores = lifecycle.tick(book, owned, 60.0, abandon_after_s=60.0)
    assert chores == [
        ("w1", Chore.WATCH),
        ("w2", Chore.WATCH),
        ("lost", Chore.FORGET),
        ("silent", Chore.ABANDON),
        ("starting", Chore.ABANDON),
        ("starting", Chore.CHECK_SPEC),
    ]
    assert book.phase("gone") is JobPhase.IDLE and book.phase("later") is JobPhase.CLAIMED
    # Not abandoned while abandon_after_s is 0 (never).
    assert Chore.ABANDON not in {c for _, c in lifecycle.tick(book, owned, 1e9, 0.0)}


def test_a_job_ended_here_is_unwatched_from_its_end_not_from_its_claim() -> None:
    book = _book(JobPhase.WATCHED, now=0.0)
    lifecycle.ended(book, JOB, 10, 1000.0, abandoned=False)  # still ours until recorded
    assert lifecycle.tick(book, {JOB}, 1001.0, abandon_after_s=60.0) == []
    assert lifecycle.tick(book, {JOB}, 1060.0, abandon_after_s=60.0) == [(JOB, Chore.ABANDON)]


def _health(step: int) -> JobHealth:
    return JobHealth(
        job=JOB,
        at=1.0,
        step=step,
        step_s=0.1,
        samples_per_s=0.0,
        balance_efficiency=1.0,
        plan_version=0,
        ranks=(),
        open_incidents=(),
    )


@pytest.mark.parametrize("abandoned", [False, True])
def test_an_end_not_stored_is_stored_from_the_tick_while_ours_never_abandoned(
    abandoned: bool,
) -> None:
    book = _book(JobPhase.WATCHED, now=0.0)
    lifecycle.ended(book, JOB, 10, 1000.0, abandoned=abandoned)
    assert lifecycle.end_unrecorded(book, JOB, _health(10), abandoned)  # first: warn
    assert not lifecycle.end_unrecorded(book, JOB, _health(10), abandoned)
    phase = book.phase(JOB)
    for now in (1001.0, 1060.0, 1e6):  # past abandon_after_s: still to store, not abandon
        assert lifecycle.tick(book, {JOB}, now, abandon_after_s=60.0) == [(JOB, Chore.RECORD_END)]
        lifecycle.claimed(book, JOB, now)  # a claim round: it stays ended
        assert book.phase(JOB) is phase
    record = book.get(JOB)
    assert record is not None and record.unrecorded_end == (_health(10), abandoned)
    assert lifecycle.end_pending(book, JOB)  # not handed over meanwhile
    lifecycle.end_recorded(book, JOB)
    assert record.unrecorded_end is None and not lifecycle.end_pending(book, JOB)


def test_an_end_not_stored_is_dropped_when_the_job_is_lost_or_runs_again() -> None:
    book = _book(JobPhase.WATCHED, now=0.0)
    lifecycle.ended(book, JOB, 10, 1000.0, abandoned=False)
    lifecycle.end_unrecorded(book, JOB, _health(10), False)
    assert lifecycle.tick(book, set(), 1001.0, abandon_after_s=60.0) == []  # its new owner's
    record = book.get(JOB)
    assert record is not None and record.unrecorded_end is None
    lifecycle.end_unrecorded(book, JOB, _health(10), False)
    assert lifecycle.greet(book, JOB, 1002.0, owned=True) is Greeting.NOTHING  # a new run
    assert record.unrecorded_end is None and record.ended_step is None


def test_dormant_jobs_are_those_marked_and_those_abandoned_here_lately(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lifecycle, "MAX_DORMANT", 4)
    book = JobBook()
    for job in ("here", "watched"):
        lifecycle.claimed(book, job, 0.0)
        lifecycle.watched(book, job, JobDetector(job, 1), (), 0.0)
    lifecycle.ended(book, "here", 5, 10.0, abandoned=True)
    # The scan (most recent first) predates "here"'s mark; "watched" is live here; past
    # MAX_DORMANT (4, counting "watched"), "m3" is not received.
    lifecycle.hold_dormant(book, ["m1", "watched", "m2", "m3"], 10.5, round_s=1.0)
    assert book.jobs(JobPhase.DORMANT) == ["m2", "m1", "here"]  # the longest dormant first
    assert book.phase("watched") is JobPhase.WATCHED and book.phase("m3") is JobPhase.IDLE
    # A round later only the marked ones are.
    lifecycle.hold_dormant(book, ["m1", "m2"], 12.0, round_s=1.0)
    assert book.jobs(JobPhase.DORMANT) == ["m2", "m1"]
    assert book.phase("here") is JobPhase.ENDED  # not dormant; its late steps still late


def test_past_max_dormant_the_longest_dormant_go_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lifecycle, "MAX_DORMANT", 2)
    book = JobBook()
    for n, job in enumerate(("a", "b", "c")):
        lifecycle.dormant(book, job, float(n))
    assert lifecycle.too_many_dormant(book, 3.0) == ["a"]
    assert book.jobs(JobPhase.DORMANT) == ["b", "c"] and book.phase("a") is JobPhase.IDLE
    lifecycle.woken(book, "b", 4.0)
    assert book.jobs(JobPhase.DORMANT) == ["c"]


def test_claims_spec_reads_and_hand_overs_are_paced() -> None:
    book = JobBook()
    assert [lifecycle.may_claim(book, JOB, t) for t in (0.0, 0.5, 1.0, 1.5)] == [
        True,
        False,
        True,
        False,
    ]
    assert lifecycle.spec_due(book, JOB, 0.0)
    warn = lifecycle.spec_read(book, JOB, 0.0, found=False, problem="spec is not JSON")
    assert warn and not lifecycle.spec_due(book, JOB, 0.5) and lifecycle.spec_due(book, JOB, 1.0)
    # The same problem is warned about once.
    assert not lifecycle.spec_read(book, JOB, 1.0, found=False, problem="spec is not JSON")
    assert lifecycle.spec_read(book, JOB, 2.0, found=False, problem="spec is invalid: x")
    assert not lifecycle.spec_read(book, JOB, 3.0, found=True, problem=None)
    assert lifecycle.spec_due(book, JOB, 3.0)
    assert lifecycle.may_hand_over(book, JOB, 0.0)
    lifecycle.handed_over(book, JOB, 10.0)
    again = lifecycle.HAND_OVER_AGAIN_S
    assert not lifecycle.may_hand_over(book, JOB, 10.0 + again - 1)
    assert lifecycle.may_hand_over(book, JOB, 10.0 + again)


def test_records_of_jobs_not_ours_are_bounded_the_least_recently_changed_go() -> None:
    book = JobBook(limit=3)
    for job in ("o1", "o2", "o3", "o4"):  # owned here: never dropped for it
        lifecycle.claimed(book, job, 0.0)
    for job in ("a", "b", "c"):
        lifecycle.may_claim(book, job, 0.0)
    lifecycle.may_claim(book, "a", 5.0)  # "a" changed: now the most recent
    lifecycle.may_claim(book, "d", 5.0)
    assert book.jobs(JobPhase.IDLE) == ["c", "a", "d"]
    assert book.jobs(JobPhase.CLAIMED) == ["o1", "o2", "o3", "o4"] and len(book) == 7
