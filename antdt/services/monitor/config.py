"""The detector's tunables (pure): a replica's defaults, which a job's spec may override."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from antdt.services.monitor.reference import ReferenceConfig
from antdt.services.monitor.speed import SpeedConfig


@dataclass(frozen=True)
class DetectorConfig:
    """Tunables of the detector; defaults suit steps of 10 ms to 10 s. A step costing
    1+δ times the job's healthy reference is a slow step (docs/detection.md)."""

    window: int = 8  # W: events per window, per rank (disjoint windows)
    slow_threshold: float = 0.2  # δ: slow step at 1+δ x the reference; leader at r <= 1-δ
    instant_threshold: float = 1.0  # a window's median at 1+this x the reference: slow at once
    open_windows: int = 3  # deviating windows in a row that open a data/comm/leader incident
    resolve_windows: int = 2  # consecutive normal windows before it resolves (hysteresis)
    persistent_windows: int = 3  # K: deviating K+ windows after a normal period: persistent
    stall_factor: float = 5.0  # stalled when silent for stall_factor * median step time ...
    min_stall_s: float = 10.0  # ... and at least this many seconds
    restart_grace_s: float = 120.0  # a rank exiting to be restarted gets this much more
    leaders: bool = True  # open LEADER incidents too
    warmup_windows: int = 0  # first measurable windows of each rank ignored (warm-up)
    data_share_floor: float = 0.3  # a data straggler waits for data >= 30% of its step
    open_base: float = 12.5  # a rank's evidence that opens its incident, + ln(ranks)
    # A rank's link is slow at a round trip to nats-server (StepEvent.link_rtt_s) above
    # max(factor x the other ranks' median, their median + floor): a multiple, seconds.
    link_rtt_factor: float = 3.0
    link_rtt_floor_s: float = 0.02
    speed: SpeedConfig = field(default_factory=SpeedConfig)  # fitting step-time models

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError("window must be >= 1")
        if not 0.0 < self.slow_threshold < 1.0:
            raise ValueError("slow_threshold must be in (0, 1)")
        if self.instant_threshold < self.slow_threshold:
            raise ValueError("instant_threshold must be >= slow_threshold")
        if min(self.open_windows, self.resolve_windows, self.persistent_windows) < 1:
            raise ValueError("open_windows, resolve_windows, persistent_windows must be >= 1")
        if self.warmup_windows < 0:
            raise ValueError("warmup_windows must be >= 0")
        if self.stall_factor <= 0 or self.min_stall_s < 0 or self.restart_grace_s < 0:
            raise ValueError("stall_factor must be > 0, min_stall_s and restart_grace_s >= 0")
        if self.link_rtt_factor < 1.0 or self.link_rtt_floor_s < 0:
            raise ValueError("link_rtt_factor must be >= 1 and link_rtt_floor_s >= 0")
        self.reference  # noqa: B018  # built (and checked) once, here

    @functools.cached_property
    def reference(self) -> ReferenceConfig:
        """The evidence model's tunables, its thresholds from δ and the instant one
        (ValueError when they do not make one)."""
        return ReferenceConfig(
            slow_at=1.0 + self.slow_threshold,
            instant_ratio=1.0 + self.instant_threshold,
            open_base=self.open_base,
        )
