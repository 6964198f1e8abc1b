"""A monitor replica's settings (environment `ANTDT_*`, see ServiceSettings)."""

from __future__ import annotations

from pydantic import Field

from antdt.runtime.config import ServiceSettings
from antdt.services.monitor.config import DetectorConfig


class MonitorSettings(ServiceSettings):
    """A replica's settings. Window, δ and K are its defaults: a job's spec may override
    them and the other detector tunables (`JobSpec.monitor`)."""

    window: int = Field(default=8, ge=2, description="Steps per detection window (W)")
    slow_threshold: float = Field(default=0.2, gt=0, lt=1, description="δ: slow at ratio >= 1+δ")
    persistent_windows: int = Field(default=3, ge=1, description="K: windows to persistent")
    max_window_rows: int = Field(
        default=1_000_000,
        ge=2,
        description="Most steps a job's own window may make the detector keep, its window "
        "times its world size (steps; it keeps about five windows per rank, ~90 bytes a "
        "step): a job's params asking more run on the replica's defaults, logged",
    )
    health_interval_s: float = Field(default=1.0, gt=0, description="JobHealth period, seconds")
    incident_retention_s: float = Field(
        default=7 * 86400, gt=0, description="ANTDT_INCIDENTS max age, seconds"
    )
    max_jobs: int | None = Field(default=None, description="Jobs one replica may own")
    step_backlog_bytes: int = Field(
        default=512 * 1024 * 1024,
        gt=0,
        description="Bytes of step events that may wait to be handled while the replica is "
        "behind, all its jobs together (each job's subscription gets an equal share); "
        "events past it are dropped and counted (code slow_consumer)",
    )
    abandon_after_s: float = Field(
        default=3600.0,
        ge=0,
        description="Seconds without a step, exit or hello from any rank of a job after "
        "which it is taken as abandoned (its launcher gave up without the ranks exiting) "
        "and ended: its incidents resolve, its ranks show exited, the services give it "
        "up; registering it again makes it live. 0: never",
    )

    def detector_config(self) -> DetectorConfig:
        return DetectorConfig(
            window=self.window,
            slow_threshold=self.slow_threshold,
            persistent_windows=self.persistent_windows,
        )
