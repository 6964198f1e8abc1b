"""Monitor: straggler detection (pure core in `detector`; the NATS shell is `service`)."""

from antdt.services.monitor.detector import DetectorConfig, JobDetector, StepColumns, StepFields

__all__ = ["DetectorConfig", "JobDetector", "StepColumns", "StepFields"]
