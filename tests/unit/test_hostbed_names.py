"""The host bed's names: unique per bed, short enough for interfaces, and telling a
sweep which bed (and creator pid) a namespace or cgroup belongs to."""

from __future__ import annotations

import pytest

from antdt.testing.hostbed._names import BedNames, creator_of


def test_a_beds_names_carry_prefix_and_creator_and_differ_between_beds() -> None:
    one, two = BedNames.new("antdt", 4242), BedNames.new("antdt", 4242)
    assert one.base != two.base
    assert one.host_ns("w0").startswith(f"antdt-4242-{one.token}-")
    assert creator_of(one.host_ns("w0"), "antdt") == 4242
    assert creator_of(one.switch_ns, "antdt") == 4242


def test_interface_names_fit_the_kernels_fifteen_characters() -> None:
    longest = "h" * 11
    BedNames.new("antdt", 1).host_ns(longest)
    assert len(BedNames.switch_port(longest)) <= 15
    assert len(BedNames.tap(longest)) <= 15
    with pytest.raises(ValueError, match="host"):
        BedNames.new("antdt", 1).host_ns(longest + "h")


@pytest.mark.parametrize(
    "name",
    ["antdtx-1-abc-w0", "antdt-x1-abc-w0", "antdt-1-abc", "other-1-abc-w0", "antdt"],
)
def test_names_of_other_owners_have_no_creator(name: str) -> None:
    assert creator_of(name, "antdt") is None


@pytest.mark.parametrize("prefix", ["", "Antdt", "a-b", "9lives", "a" * 13])
def test_a_prefix_the_names_cannot_carry_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        BedNames.new(prefix, 1)
