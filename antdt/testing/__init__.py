"""Test doubles for code that talks to AntDT, used by its own tests and bench: stand-in
ranks that answer the controller's commands over real NATS, and real CPU contention (a
noisy neighbour pinned to a rank's core, a scenario in the foreground of a shared
machine), certificates for TLS made with openssl. No product module imports this package."""

from antdt.testing.contention import cores, neighbour_from_step, noisy_neighbour, pin, pinned
from antdt.testing.foreground import foreground
from antdt.testing.pki import SERVER_SAN, Pki, expired_certificate, make_pki
from antdt.testing.ranks import (
    AckHook,
    FakeRanks,
    acking_ranks,
    drawn_health,
    job_health,
    signed_by_another,
)

__all__ = [
    "SERVER_SAN",
    "AckHook",
    "FakeRanks",
    "Pki",
    "acking_ranks",
    "cores",
    "drawn_health",
    "expired_certificate",
    "foreground",
    "job_health",
    "make_pki",
    "neighbour_from_step",
    "noisy_neighbour",
    "pin",
    "pinned",
    "signed_by_another",
]
