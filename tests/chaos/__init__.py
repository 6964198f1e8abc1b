"""The chaos soak (issue 40): a real job on replicated services and 3-node clusters
under a seeded schedule of faults, and the invariants checked after it. Run it with
`python -m tests.chaos` (`make chaos`); tests/e2e/test_chaos.py runs a short one."""

from tests.chaos.soak import Soak, run_soak

__all__ = ["Soak", "run_soak"]
