"""Monitor: straggler detection (pure core in `detector`; the NATS shell is `service`)."""

from antdt.services.monitor.detector import DetectorConfig, JobDetector

__all__ = ["DetectorConfig", "JobDetector"]
