"""Per-job detector configuration (pure): the replica's defaults overridden by the job's
spec, read when the job is taken on. Params the replica cannot use never stop detection:
the job gets the defaults, and the reason comes back for the log."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import ValidationError

from antdt.runtime.store import StoredValueInvalid, decode_object, decode_stored
from antdt.schemas import JobSpec, MonitorParams
from antdt.services.monitor.config import DetectorConfig


def read_spec(raw: bytes, key: str = "spec") -> tuple[JobSpec | None, str | None]:
    """The stored spec, and why its `monitor` section was dropped (None: it was not).

    A spec that is invalid only in its monitor section (written by hand, or by a newer
    version with a field this one does not know) is kept without it. (None, reason) when
    the spec itself is unreadable."""
    try:
        return decode_stored(key, raw, JobSpec), None
    except StoredValueInvalid as exc:
        error = exc.reason
    try:
        fields = decode_object(key, raw)
    except StoredValueInvalid as exc:
        not_json = exc.reason == "not JSON"
        return None, "spec is not JSON" if not_json else f"spec is invalid: {error}"
    if fields.get("monitor") is None:
        return None, f"spec is invalid: {error}"
    fields.pop("monitor")
    try:
        spec = JobSpec.model_validate(fields)
    except ValidationError:
        return None, f"spec is invalid: {error}"
    return spec, f"monitor params invalid ({error})"


def job_config(
    defaults: DetectorConfig,
    params: MonitorParams | None,
    *,
    world_size: int = 1,
    max_window_rows: int | None = None,
) -> tuple[DetectorConfig, str | None]:
    """`defaults` with the job's params applied, and why they were not (None: they were).
    A mix the detector refuses (a job's δ above the replica's instant threshold, say)
    is dropped as a whole: the job runs on the defaults, never on a half-applied mix.
    So is a window whose steps over the job's `world_size` ranks pass `max_window_rows`:
    the detector keeps each rank's open and latest windows, memory a spec must not set
    unbounded."""
    if params is None:
        return defaults, None
    overrides: dict[str, Any] = params.overrides()  # the names match DetectorConfig's
    try:
        config = dataclasses.replace(defaults, **overrides)
    except (TypeError, ValueError) as exc:
        return defaults, f"monitor params {overrides} rejected: {exc}"
    rows = config.window * world_size
    if max_window_rows is not None and "window" in overrides and rows > max_window_rows:
        reason = f"window {config.window} x {world_size} ranks = {rows} steps kept"
        return defaults, f"monitor params {overrides} rejected: {reason} > {max_window_rows}"
    return config, None


__all__ = ["job_config", "read_spec"]
