"""E-18: the `to` grammar."""

from __future__ import annotations

import pytest

from reference.core import Destination, DestinationError, parse_destination

HEX = "0123456789abcdef" * 4


@pytest.mark.parametrize(("to", "expected"), [
    ("#general", Destination("topic", "general")),
    ("topic:a.b-c_d", Destination("topic", "a.b-c_d")),
    (HEX, Destination("dm", HEX)),
    (HEX.upper(), Destination("dm", HEX)),
    (f"dm:{HEX.upper()}", Destination("dm", HEX)),
    ("queue:jobs:high", Destination("queue", "jobs:high")),
    ("#" + "a" * 64, Destination("topic", "a" * 64)),
])
def test_grammar(to, expected):
    assert parse_destination(to) == expected


@pytest.mark.parametrize("to", [
    "@group", "*", "#", "#Upper", "#" + "a" * 65, "topic:", "dm:" + HEX[:-1], HEX[:-1], "queue:", "queue:-x",
    "nonsense", "dm:zz",
])
def test_unresolvable(to):
    with pytest.raises(DestinationError):
        parse_destination(to)
