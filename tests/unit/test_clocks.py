"""Two PCs' clocks against their certificates' dates (``discovery.clocks``), with plain numbers: no clock is read."""

from __future__ import annotations

import pytest

from discovery.clocks import Validity, clock_problem, duration

DAY = 86400.0
NOW = 2_000_000_000.0
"""pc1's clock, which is right."""
RECENT = Validity(NOW - 3600, NOW + 365 * DAY)
"""A certificate issued an hour ago, for a year."""
OLD = Validity(NOW - 100 * DAY, NOW + 265 * DAY)
"""One issued a hundred days ago."""


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.4, "0 s"), (-40, "40 s"), (600, "10 min"), (5 * 3600, "5 h"), (DAY, "24 h"), (2 * DAY - 3, "2 days")],
)
def test_durations_read_in_the_unit_that_fits(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_a_pc_two_days_behind_is_named_alike_on_both_sides() -> None:
    # pc3 is two days behind pc1, and pc1's certificate is an hour old: pc3 finds it not yet valid
    at_pc1 = clock_problem("pc1", "pc3", NOW, NOW - 2 * DAY, RECENT, OLD)
    at_pc3 = clock_problem("pc3", "pc1", NOW - 2 * DAY, NOW, OLD, RECENT)
    assert at_pc1 == (
        "pc3's clock is 2 days behind this PC's (pc1): pc1's certificate is not yet valid by it; set pc3's clock (NTP)"
    )
    assert at_pc3 == (
        "pc3's clock (this PC) is 2 days behind pc1's: pc1's certificate is not yet valid by it; set pc3's clock (NTP)"
    )


def test_a_pc_behind_links_with_peers_whose_certificates_are_older_than_its_clock() -> None:
    assert clock_problem("pc1", "pc3", NOW, NOW - 2 * DAY, OLD, OLD) is None
    assert clock_problem("pc3", "pc1", NOW - 2 * DAY, NOW, OLD, OLD) is None
    # within the 5 minutes a certificate starts early, a small drift is nothing
    assert clock_problem("pc1", "pc3", NOW, NOW - 200, Validity(NOW - 300, NOW + DAY), OLD) is None


def test_a_pc_ahead_links_until_a_certificate_nears_its_expiry() -> None:
    assert clock_problem("pc1", "pc2", NOW, NOW + 2 * DAY, RECENT, RECENT) is None
    ending = Validity(NOW - 300 * DAY, NOW + DAY)
    assert clock_problem("pc1", "pc2", NOW, NOW + 2 * DAY, ending, RECENT) == (
        "pc2's clock is 2 days ahead of this PC's (pc1): pc1's certificate has expired by it; set pc2's clock (NTP)"
    )
    assert clock_problem("pc2", "pc1", NOW + 2 * DAY, NOW, RECENT, ending) == (
        "pc2's clock (this PC) is 2 days ahead of pc1's: pc1's certificate has expired by it; set pc2's clock (NTP)"
    )


def test_dates_wrong_by_both_clocks_are_the_certificates_not_a_clock() -> None:
    expired = Validity(NOW - 400 * DAY, NOW - DAY)
    assert clock_problem("pc1", "pc2", NOW, NOW + 10, RECENT, expired) == (
        "pc2's certificate expired on 2033-05-17 03:33 UTC: renew it: `shoal fleet issue pc2 --force` on the "
        "admin's PC (or `shoal join` there with a new token)"
    )
    future = Validity(NOW + DAY, NOW + 365 * DAY)
    problem = clock_problem("pc1", "pc2", NOW, NOW, future, RECENT)
    assert problem is not None and problem.startswith("pc1's certificate is not valid before 2033-05-19 03:33 UTC")
    assert "had its clock ahead" in problem
