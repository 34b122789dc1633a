"""``shoal doctor``'s judgement: what is wrong with this PC's place in the fleet, and what to do about it.

Pure functions over what the command gathered (the identity's certificates, the agent's status, mDNS probes,
handshakes with each known peer); ``agent.cli.doctor_cmd`` gathers it and prints the findings.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509

from discovery.clocks import duration
from discovery.mdns import MulticastProbe

EXPIRY_WARNING = dt.timedelta(days=14)
SKEW_WARNING = 60.0
"""Seconds of clock difference with a linked peer worth a word. A link that is up works whatever the difference
(its certificates were checked when it came up); a peer whose clock keeps a link from forming is told apart, with
the agent's own sentence for it (``discovery.clocks``)."""


@dataclass(frozen=True)
class Finding:
    """One check's result: ``ok`` False is a problem (the command then exits non-zero)."""

    check: str
    ok: bool
    message: str
    advice: str = ""


def check_certificate(
    cert: x509.Certificate, ca: x509.Certificate, key_matches: bool, revoked: bool, now: dt.datetime
) -> list[Finding]:
    """The node certificate: signed by the fleet CA, matching its key, valid now and for a while, not revoked."""
    renew = "get a new one: `shoal fleet issue NODE` on the admin's PC (or `shoal join` with a new token)"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError) as exc:  # cryptography: wrong issuer, or a bad signature
        return [Finding("certificate", False, f"the node certificate is not signed by the fleet CA: {exc}", renew)]
    found = []
    if not key_matches:
        found.append(Finding("certificate", False, "the private key does not belong to the node certificate", renew))
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now < start:
        found.append(
            Finding(
                "certificate",
                False,
                f"the node certificate is not valid before {start:%Y-%m-%d %H:%M} UTC",
                "this PC's clock is behind: set it right (NTP)",
            )
        )
    elif now > end:
        found.append(Finding("certificate", False, f"the node certificate expired on {end:%Y-%m-%d} UTC", renew))
    elif end - now < EXPIRY_WARNING:
        found.append(Finding("certificate", True, f"the node certificate expires soon, on {end:%Y-%m-%d} UTC", renew))
    else:
        found.append(Finding("certificate", True, f"valid until {end:%Y-%m-%d}, signed by the fleet CA"))
    if revoked:
        found.append(
            Finding(
                "certificate",
                False,
                "this node's certificate is on the fleet's revocation list: no member will admit it",
                "ask the admin to enroll this PC again (`shoal fleet token`, then `shoal join` here)",
            )
        )
    return found


def check_agent(address: str | None, status: Mapping[str, Any] | None, error: str | None) -> list[Finding]:
    """Whether this PC's agent runs and answers on its port."""
    if address is None:
        return [
            Finding(
                "agent",
                False,
                "no agent runs with this identity (no agent.json in its folder)",
                "start it: `shoal agent` (or name it: `shoal doctor --agent HOST:PORT`)",
            )
        ]
    if status is None:
        return [
            Finding(
                "agent",
                False,
                f"the agent does not answer at {address}: {error}",
                "is `shoal agent` running? Is its port blocked by a firewall on this PC?",
            )
        ]
    return [Finding("agent", True, f"the agent answers at {address}")]


IDLE_ADVICE = {
    "linux": "run the agent inside the user's desktop session (a user unit of the graphical session has its DISPLAY "
    "and DBUS_SESSION_BUS_ADDRESS): GNOME and KDE need nothing more, X11 python-xlib",
    "win32": "start the agent in the user's session at logon (`shoal service install`), not as a session-0 service",
    "darwin": "pip install 'shoal[macos]' (pyobjc-framework-Quartz)",
}


def check_idle(source: str | None, seconds: float | None, problems: str, platform: str) -> list[Finding]:
    """The donor's idle source (``agent.donor.idle``): the ``source`` picked and its reading ``seconds``, or None
    and why each one failed (``problems``). Not a fault (a PC need not donate), so ``ok`` either way; the message
    says what to install or change."""
    if source is not None and seconds is not None:
        return [Finding("idle", True, f"idle source {source}: {seconds:.0f} s since the last keyboard or mouse input")]
    advice = IDLE_ADVICE.get(platform, IDLE_ADVICE["linux"])
    return [
        Finding(
            "idle",
            True,
            f"no idle source works here ({problems}): as a donor this PC serves never, or only on its schedule "
            f'where [donor] no_source = "schedule"; to detect the user: {advice}',
        )
    ]


def check_members(members: Mapping[str, Any], version: str, reachable: Mapping[str, str | None]) -> list[Finding]:
    """The agent's ``members`` status section: peers lost, foreign or of another version; clock skew; and
    ``reachable`` (address -> None, or why this PC cannot reach it over TLS)."""
    found = []
    listed: Sequence[Mapping[str, Any]] = members.get("members", [])
    members_up = [m for m in listed if m["state"] == "member"]
    if not listed:
        found.append(
            Finding(
                "members",
                False,
                "the agent knows no other member of its fleet",
                "on a network without multicast, give the agent a member to start from: `shoal agent --peer "
                "HOST:PORT` (or `peers` in its config)",
            )
        )
    else:
        found.append(Finding("members", True, f"{len(members_up)} of {len(listed)} known peers are members"))
    for member in listed:
        name, address, state = member["name"], member["address"], member["state"]
        if state == "lost":
            found.append(
                Finding(
                    "members",
                    False,
                    f"{name} ({address}) is lost: {member['why']}",
                    "is that PC on and its agent running?",
                )
            )
        elif state == "foreign":
            found.append(Finding("fleet", True, f"{name} ({address}) is not of this fleet: {member['why']} (ignored)"))
        elif state == "revoked":
            found.append(Finding("fleet", True, f"{name} ({address}) is revoked (refused)"))
        announced = member["announces"]["version"]
        if state == "member" and announced != version:
            found.append(
                Finding(
                    "version", True, f"{name} runs shoal {announced}, this PC {version}", "update both to one version"
                )
            )
        skew, problem = member.get("clock_skew"), member.get("clock")
        if problem:
            found.append(Finding("clock", False, problem, "the PC named must have its clock set: then they link"))
        elif isinstance(skew, int | float) and abs(skew) > SKEW_WARNING:
            found.append(Finding("clock", True, skew_works(name, skew)))
    for address, why in sorted(reachable.items()):
        if why is not None:
            found.append(
                Finding(
                    "reach",
                    False,
                    f"cannot reach the member at {address} over TLS: {why}",
                    "a firewall may block the agent's port between the PCs",
                )
            )
    return found


def skew_works(name: str, skew: float) -> str:
    """What a clock difference of ``skew`` seconds (``name``'s clock minus this PC's) means while certificates pass:
    the link works; the PC behind refuses a certificate issued within that difference of its clock, the PC ahead
    one that close to its expiry (``discovery.clocks``)."""
    by = duration(skew)
    if skew > 0:
        return (
            f"{name}'s clock is {by} ahead of this PC's: links work; {name} refuses a certificate only in its last "
            f"{by} before it expires. Set the wrong clock right (NTP)"
        )
    return (
        f"{name}'s clock is {by} behind this PC's: links work with certificates older than {by}; {name} refuses one "
        "issued since as not yet valid. Set the wrong clock right (NTP)"
    )


def check_multicast(
    probes: Sequence[MulticastProbe], mdns_on: bool, members: Mapping[str, Any] | None
) -> list[Finding]:
    """Whether mDNS works here: each interface hears its own probe, and the members known over TLS are
    heard announcing too."""
    if not mdns_on:
        return [
            Finding("multicast", True, "mDNS is off for this agent (loopback, or --no-mdns): peers come from --peer")
        ]
    found = []
    heard = set().union(*(p.peers for p in probes)) if probes else set()
    for probe in probes:
        if probe.error or not probe.own_heard:
            found.append(
                Finding(
                    "multicast",
                    False,
                    f"this PC does not hear its own mDNS on {probe.address}"
                    + (f": {probe.error}" if probe.error else ""),
                    "multicast does not work on this interface (a firewall on this PC blocking UDP 5353?); "
                    "meanwhile give the agent `--peer HOST:PORT` of a member",
                )
            )
        else:
            found.append(Finding("multicast", True, f"mDNS works on {probe.address} ({len(probe.peers)} agents heard)"))
    known = [m for m in (members or {}).get("members", []) if m["state"] == "member"]
    silent = [m["name"] for m in known if m["node"] not in heard]
    if known and len(silent) == len(known):
        found.append(
            Finding(
                "multicast",
                False,
                f"none of the {len(known)} members known over TLS is heard over mDNS here ({', '.join(silent)})",
                "multicast is blocked between the PCs (VLANs, Wi-Fi client isolation, a switch or firewall); the "
                "fleet still works through `--peer HOST:PORT` of one member (or `peers` in the config); ask IT "
                "to let mDNS (UDP 5353, 224.0.0.251) through",
            )
        )
    return found
