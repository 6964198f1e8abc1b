"""Whether a bed can run here, and if not, why (for a test's skip reason)."""

from __future__ import annotations

import functools
import os
import subprocess
import uuid

from antdt.testing.hostbed import _net


@functools.cache
def unavailable_reason() -> str | None:
    """None where beds can run; else what is missing (root, iproute2, namespaces)."""
    if os.geteuid() != 0:
        return "the host bed needs root (network namespaces, cgroups)"
    if missing := _net.tools_missing():
        return f"the host bed needs iproute2 ({', '.join(missing)} missing: make hosttools)"
    probe = f"antdtprobe{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"network namespaces unsupported here: {made.stderr.strip()}"
    _net.delete_netns(probe)
    return None
