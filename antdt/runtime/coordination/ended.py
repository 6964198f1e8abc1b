"""Which jobs have ended, for every service alike: the etcd key `jobs/{job}/ended` is the
truth; what this process read there, or saw end, is remembered (bounded) until the job
runs again. Writing the key stays with whoever ends the job (the monitor)."""

from __future__ import annotations

from antdt.runtime.coordination.jobs import Ended, read_end
from antdt.runtime.recent import Recent
from antdt.runtime.store import Store
from antdt.schemas import JobHealth, Keys, RankState

#: Ends remembered at most (the least recently learned go first): job ids come off the
#: wire, and a job forgotten here is only read again.
MAX_REMEMBERED = 4096


class EndedJobs:
    """`read` asks etcd; `is_ended` answers from memory when it can; `note` remembers an
    end seen here; `forget` drops one (the job registered or started again)."""

    def __init__(self, store: Store, keys: Keys, *, limit: int = MAX_REMEMBERED) -> None:
        self._store = store
        self._keys = keys
        self._known: Recent[Ended] = Recent(limit)

    async def read(self, job: str) -> Ended | None:
        """The job's end as etcd holds it now (None: it has not ended); remembered."""
        end = await read_end(self._store, self._keys, job)
        if end is None:
            self._known.pop(job)
        else:
            self._known.put(job, end)
        return end

    def known(self, job: str) -> Ended | None:
        """The end last read or noted for `job`, without asking etcd."""
        return self._known.get(job)

    async def is_ended(self, job: str) -> bool:
        """Has `job` ended? From memory when an end is known, else from etcd."""
        return job in self._known or await self.read(job) is not None

    def note(self, health: JobHealth, revision: int = 0) -> Ended:
        """Remember that `job` ended with this last health (stored at `revision`, or 0:
        not read from etcd), before or without reading its key."""
        end = Ended(health.job, health.at, health.step, revision, None)
        self._known.put(health.job, end)
        return end

    def forget(self, job: str) -> None:
        """`job` runs again (registered again, a rank started): read its end afresh."""
        self._known.pop(job)

    def __len__(self) -> int:
        return len(self._known)


def shows_end(health: JobHealth) -> bool:
    """Every rank's process finished or closed: the monitor's last health of an ended job
    (it writes the `ended` key right after publishing it)."""
    return all(state is RankState.EXITED for state in health.ranks.state)
