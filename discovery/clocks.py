"""Two PCs' clocks and the fleet's certificates: whether a control link can form between them, and whose clock to set.

A certificate is valid from its ``notBefore`` to its ``notAfter`` by the clock of the PC that checks it, and each
end of a mutual-TLS link checks the other's certificate by its own clock. So a PC whose clock is behind refuses
every certificate issued after its clock's time ("not yet valid"), and one whose clock is ahead refuses those
whose expiry its clock has passed ("has expired"); the CA starts certificates 5 minutes early
(``agent.fleet.authority.CLOCK_SKEW``) for the small drifts. A PC ahead by days links as well as any other until a
certificate nears its expiry; a PC behind cannot link with a peer whose certificate is newer than its clock.

Which of the two clocks is wrong shows from the certificates: the CA issued them at its own (right) time, so the
PC by whose clock a certificate is not yet valid while its holder's clock finds it valid is the one behind. The
clock probe (``discovery.service``) gives one agent the other's time and certificate over a link that skips the
dates; :func:`clock_problem` says what it means, in the sentence both PCs show. Pure: no clock is read here.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from cryptography import x509

RENEW = "renew it: `shoal fleet issue NODE --force` on the admin's PC (or `shoal join` there with a new token)"
"""What to do about a certificate past its dates by every clock."""


@dataclass(frozen=True)
class Validity:
    """When a certificate chain is valid, in Unix seconds: from ``not_before`` to ``not_after``."""

    not_before: float
    not_after: float

    @classmethod
    def of(cls, *certificates: x509.Certificate) -> Validity:
        """When all of ``certificates`` are valid at once (a node's certificate and its fleet CA's)."""
        return cls(
            max(c.not_valid_before_utc.timestamp() for c in certificates),
            min(c.not_valid_after_utc.timestamp() for c in certificates),
        )


def duration(seconds: float) -> str:
    """``seconds`` for people, rounded to the unit that reads best: 40 s, 12 min, 5 h, 2 days."""
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.0f} h"
    days = round(seconds / 86400)
    return f"{days} day{'s' if days != 1 else ''}"


def clock_problem(me: str, peer: str, now: float, their_time: float, mine: Validity, theirs: Validity) -> str | None:
    """Why this agent (named ``me``, its clock at ``now``) and ``peer`` (its clock at ``their_time``) cannot link
    on their certificates' dates (``mine``, ``theirs``), in one sentence for both PCs' people; None if each
    certificate is valid by the other's clock."""
    # each end checks the other's certificate by its own clock: (who checks, its clock for people, its time,
    # whose certificate, that PC's clock for people, that PC's time, the certificate's dates)
    sides = (
        (me, f"{me}'s clock (this PC)", now, peer, f"{peer}'s", their_time, theirs),
        (peer, f"{peer}'s clock", their_time, me, f"this PC's ({me})", now, mine),
    )
    for checker, clock, time, holder, other, holder_time, dates in sides:
        if time < dates.not_before:
            if holder_time < dates.not_before:  # its own PC finds it not yet valid too: not a clock of theirs
                return (
                    f"{holder}'s certificate is not valid before {_date(dates.not_before)} by either PC's clock: "
                    "the PC that issued it had its clock ahead; set that clock (NTP) and issue the certificate again"
                )
            return (
                f"{clock} is {duration(holder_time - time)} behind {other}: {holder}'s certificate is not yet valid "
                f"by it; set {checker}'s clock (NTP)"
            )
    for checker, clock, time, holder, other, holder_time, dates in sides:
        if time > dates.not_after:
            if holder_time > dates.not_after:
                return f"{holder}'s certificate expired on {_date(dates.not_after)}: {RENEW.replace('NODE', holder)}"
            return (
                f"{clock} is {duration(time - holder_time)} ahead of {other}: {holder}'s certificate has expired by "
                f"it; set {checker}'s clock (NTP)"
            )
    return None


def _date(when: float) -> str:
    return f"{dt.datetime.fromtimestamp(when, dt.UTC):%Y-%m-%d %H:%M} UTC"
