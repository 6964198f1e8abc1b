"""The controller's blocklist read against the time, and its table (pure)."""

from __future__ import annotations

from rich.console import Console

from antdt.cli.blocklist import blocklist_table
from antdt.schemas import BlocklistEntry
from antdt.services.controller.blocklist import Blocklist


def entry(host: str, until: float | None) -> BlocklistEntry:
    return BlocklistEntry(
        host=host,
        job="j",
        rank=3,
        action_id="j-restart-1",
        reason="persistent straggler",
        at=1000.0,
        until=until,
    )


def test_entries_block_until_they_end_and_deletes_unblock() -> None:
    blocklist = Blocklist()
    blocklist.apply("a", entry("a", 2000.0).model_dump_json().encode(), revision=5)
    blocklist.apply("b", entry("b", None).model_dump_json().encode(), revision=6)
    blocklist.apply("c", b"written by hand", revision=7)  # unreadable: blocked until deleted
    assert blocklist.hosts(1999.0) == {"a", "b", "c"}
    assert blocklist.hosts(2000.0) == {"b", "c"}
    assert blocklist.expired(2000.0) == [("a", 5)] and blocklist.expired(1999.0) == []
    blocklist.apply("a", entry("a", 5000.0).model_dump_json().encode(), revision=9)  # renewed
    assert "a" in blocklist.hosts(2500.0) and blocklist.expired(2500.0) == []
    blocklist.apply("b", None, revision=10)
    assert blocklist.hosts(2500.0) == {"a", "c"}


def test_the_table_says_until_when_each_host_is_avoided() -> None:
    rows = [
        ("h2", entry("h2", 1000.0 + 2 * 3600)),
        ("h1", entry("h1", 500.0)),
        ("h3", entry("h3", None)),
        ("h4", None),
    ]
    console = Console(record=True, width=200)
    console.print(blocklist_table(rows, now=1000.0))
    text = console.export_text()
    assert "blocklist: 4 host(s)" in text
    lines = {line.split()[1]: line for line in text.splitlines() if line.startswith("│ h")}
    assert "(2h00m left)" in lines["h2"] and "expired" in lines["h1"]
    assert "until allowed" in lines["h3"] and "not a BlocklistEntry" in lines["h4"]
    assert "j-restart-1" in lines["h2"] and "persistent straggler" in lines["h2"]
