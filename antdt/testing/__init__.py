"""Test doubles for code that talks to AntDT, used by its own tests and bench: stand-in
ranks that answer the controller's commands over real NATS. No product module imports
this package."""

from antdt.testing.ranks import AckHook, FakeRanks, acking_ranks, job_health, signed_by_another

__all__ = ["AckHook", "FakeRanks", "acking_ranks", "job_health", "signed_by_another"]
