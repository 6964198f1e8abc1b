"""Done refs a shards replica accepted but had not made durable when it replied: each is
reported again until a reply no longer lists it. Pure: the caller passes the time."""

from __future__ import annotations

from dataclasses import dataclass, field

from antdt.schemas import ShardRef

#: Seconds after it was last sent that an unconfirmed done ref goes out again (twice the
#: service's done_flush_interval_s).
RECONFIRM_AFTER_S = 0.05


@dataclass
class Unconfirmed:
    """Done refs the service accepted but had not made durable when it replied (the
    reply's `unconfirmed`), each with the time it was last sent. Each goes out again once
    RECONFIRM_AFTER_S has passed, until a reply no longer lists it: a replica that died
    before its write loses no done mark, only delays it."""

    # In sending order (one request at a time: times only grow), so `due` stops at the
    # first ref not due instead of scanning them all on every request.
    sent_at: dict[ShardRef, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.sent_at)

    def refs(self) -> list[ShardRef]:
        return list(self.sent_at)

    def due(self, now: float | None, everything: bool = False) -> list[ShardRef]:
        """Take out the refs to send again at `now` (monotonic seconds; None, or
        `everything`: all of them)."""
        if everything or now is None:
            due, self.sent_at = list(self.sent_at), {}
            return due
        due = []
        for ref, sent in self.sent_at.items():
            if now - sent < RECONFIRM_AFTER_S:
                break  # the rest were sent later (a time out of order only delays a ref)
            due.append(ref)
        for ref in due:
            del self.sent_at[ref]
        return due

    def answered(self, unconfirmed: tuple[ShardRef, ...], sent_at: float) -> None:
        """A reply listed these refs, sent at `sent_at`, as accepted but not durable."""
        sent = self.sent_at
        for ref in unconfirmed:
            sent.pop(ref, None)  # to the end: the dict stays in sending order
            sent[ref] = sent_at
