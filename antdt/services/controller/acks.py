"""The one ack tally: which ranks accepted a command sent to every rank of a job. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from antdt.schemas import Ack, ActionResult, AdjustBatch, ErrorReply, KillRestart

Command = AdjustBatch | KillRestart


@dataclass
class AckTally:
    """A rank counts once it acked ok (an AdjustBatch at its plan's version, a KillRestart
    at exactly its checkpoint step). ok=False to a KillRestart is the rank's final
    refusal; to an AdjustBatch the rank is asked again. Any other reply is not an ack and
    is kept in `rejected` with the reason."""

    command: Command
    world_size: int
    ok: dict[int, Ack] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)

    def add(self, reply: Ack | ErrorReply, sent_to: int | None = None) -> str:
        """Count `reply` (to the command sent to rank `sent_to`, None: to every rank);
        returns why it is not an ack ('' when it is one)."""
        if isinstance(reply, ErrorReply):
            reason = f"error reply: {reply.code}: {reply.error}"[:200]
        else:
            reason = ack_problem(self.command, reply, self.world_size, sent_to)
        if reason:
            self.rejected.append(reason)
            return reason
        assert isinstance(reply, Ack)
        if reply.rank in self.ok or reply.rank in self.refused:
            return ""  # a duplicate (a retry's answer): the first one counts
        if reply.ok:
            self.ok[reply.rank] = reply
        elif isinstance(self.command, KillRestart):
            self.refused[reply.rank] = reply.error or "refused without a reason"
        return ""

    @property
    def acked(self) -> list[int]:
        return sorted(self.ok)

    @property
    def pending(self) -> list[int]:
        return [r for r in range(self.world_size) if r not in self.ok and r not in self.refused]

    @property
    def complete(self) -> bool:
        """Every rank acked or refused: counted, not listed (asked after every reply of a
        broadcast, where a list of the ranks pending made 10,000 acks 100,000,000 steps)."""
        return len(self.ok) + len(self.refused) >= self.world_size

    @property
    def result(self) -> ActionResult:
        return ack_result(len(self.ok), self.world_size)

    def error(self) -> str | None:
        """Why ranks did not accept, for the ActionRecord (None: every rank did)."""
        parts = [f"rank {r}: {e}" for r, e in sorted(self.refused.items())]
        parts += [f"no ack from rank {r}" for r in self.pending]
        parts += [f"not an ack: {reason}" for reason in dict.fromkeys(self.rejected)]
        return "; ".join(parts)[:1024] or None


def ack_problem(command: Command, ack: Ack, world_size: int, sent_to: int | None) -> str:
    """Why `ack` is not an ack of `command` ('' when it is)."""
    if ack.job != command.job or ack.action_id != command.action_id:
        return f"ack for {ack.job}/{ack.action_id}, expected {command.job}/{command.action_id}"
    if sent_to is not None and ack.rank != sent_to:
        return f"ack from rank {ack.rank} to a command for rank {sent_to}"
    if ack.rank >= world_size:
        return f"ack from rank {ack.rank}, outside the job (world size {world_size})"
    if not ack.ok:
        return ""
    if isinstance(command, AdjustBatch) and ack.plan_version not in (None, command.plan.version):
        return f"rank {ack.rank} acked plan version {ack.plan_version}, not {command.plan.version}"
    if isinstance(command, KillRestart) and ack.applied_step != command.checkpoint_step:
        return f"rank {ack.rank} acked step {ack.applied_step}, not {command.checkpoint_step}"
    return ""


def ack_result(acked: int, world_size: int) -> ActionResult:
    """APPLIED when every rank acked, PARTIAL when some did, else FAILED."""
    if acked == world_size:
        return ActionResult.APPLIED
    return ActionResult.PARTIAL if acked else ActionResult.FAILED
