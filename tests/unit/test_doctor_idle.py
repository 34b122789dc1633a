"""``shoal doctor``'s line on the donor's idle source: which one this PC uses and its reading, or why none works
and what to install or change."""

from __future__ import annotations

import pytest

from discovery.doctor import check_idle


def test_the_source_in_use_and_its_reading() -> None:
    (finding,) = check_idle("gnome", 12.4, "", "linux")
    assert (finding.check, finding.ok) == ("idle", True)
    assert finding.message == "idle source gnome: 12 s since the last keyboard or mouse input"


@pytest.mark.parametrize(
    ("platform", "advice"),
    [
        ("linux", "run the agent inside the user's desktop session"),
        ("win32", "start the agent in the user's session at logon"),
        ("darwin", "pip install 'shoal[macos]'"),
    ],
)
def test_no_source_says_why_and_what_to_do(platform: str, advice: str) -> None:
    (finding,) = check_idle(None, None, "x11: DISPLAY is not set (no X11 session here)", platform)
    assert finding.ok  # a PC need not donate: not a fault of the fleet
    assert finding.message.startswith("no idle source works here (x11: DISPLAY is not set (no X11 session here)): ")
    assert 'no_source = "schedule"' in finding.message
    assert advice in finding.message
