"""Where a rank's next shard request goes: the shards service's queue group, or straight
to the replica a reply named as the job's owner. Pure: the caller passes the time. A
failed direct request goes back to the queue group, and that replica is not routed to
for `cooldown_s` (a killed replica is still named until its lease lapses)."""

from __future__ import annotations

from antdt.schemas import Subjects

#: Seconds a replica whose direct request failed is not routed to again.
ROUTE_COOLDOWN_S = 10.0


class ShardRoute:
    def __init__(self, subjects: Subjects, job: str, *, cooldown_s: float = ROUTE_COOLDOWN_S):
        self._subjects = subjects
        self._job = job
        self.cooldown_s = cooldown_s
        self.shared = subjects.shards(job, "fetch")
        self.route = ""  # the replica the next fetch goes to; "" for the queue group
        self.subject = self.shared
        self._avoid: dict[str, float] = {}  # route -> time until which it is not used
        self.fallbacks = 0  # direct requests that failed

    def subject_for(self, verb: str) -> str:
        """The subject of a `verb` request (fetch, commit, restore, release) now."""
        if verb == "fetch":
            return self.subject
        if self.route:
            return self._subjects.shards_direct(self._job, verb, self.route)
        return self._subjects.shards(self._job, verb)

    def on_reply(self, route: str, now: float) -> None:
        """A reply arrived (naming the owner's route, or "")."""
        if route and self._avoid.get(route, 0.0) > now:
            route = ""
        if route != self.route:
            self.route = route
            self.subject = (
                self._subjects.shards_direct(self._job, "fetch", route) if route else self.shared
            )

    def on_failure(self, now: float) -> None:
        """The last request got no reply, or a refusal: back to the queue group."""
        if self.route:
            self.fallbacks += 1
            self._avoid[self.route] = now + self.cooldown_s
            self.route, self.subject = "", self.shared
