"""``shoal doctor``: what a user runs when "it doesn't find the others". Gathers the facts; ``discovery.doctor``
judges them. Prints one line per finding (and what to do), and exits 1 if anything is wrong."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization

from agent.addresses import parse_address
from agent.cli.common import Subcommands, identity_dir
from agent.cli.status_link import StatusLink
from agent.donor.idle import IdleSource, describe_problems, pick_source
from agent.errors import FleetError, RingError
from agent.fleet import NodeIdentity, read_certificate
from agent.node.running import running_agent
from discovery.doctor import Finding, check_agent, check_certificate, check_idle, check_members, check_multicast
from discovery.kept import revocation_keeper
from discovery.mdns import MulticastProbe, probe_multicast

PEER_TIMEOUT = 3.0
"""Seconds for each step with an agent: the dial (its TLS handshake included), its hello, a status request."""
ASK_TIMEOUT = 3 * PEER_TIMEOUT + 1.0
"""Seconds at most for all that is asked of one agent, the goodbye included: however an agent or a peer behaves
(a handshake that stalls, a hello that never comes, a close never acknowledged), doctor moves on."""
PROBE_SLACK = 5.0
"""Seconds an mDNS probe may take beyond its listening time (announcing, then withdrawing, its probe service)."""


def add_parser(sub: Subcommands) -> None:
    """Register ``shoal doctor``."""
    p = sub.add_parser("doctor", help="check why this PC does not find the fleet (or it this PC); exit 1 if wrong")
    p.add_argument("--identity", type=Path, default=None, help="this node's identity folder")
    p.add_argument("--agent", default=None, metavar="HOST:PORT", help="the agent to ask (default: the running one)")
    p.add_argument("--probe-seconds", type=float, default=3.0, help="how long each mDNS probe listens (3)")


def run_doctor(args: argparse.Namespace, data_dir: Path) -> int:
    identity = NodeIdentity.load(identity_dir(args.identity, data_dir))
    findings = asyncio.run(diagnose(identity, args.agent, args.probe_seconds))
    for finding in findings:
        mark = "ok  " if finding.ok else "FAIL"
        print(f"{mark} {finding.check:<12} {finding.message}")
        if finding.advice and not finding.ok:
            print(f"     {'':<12} -> {finding.advice}")
    problems = sum(not f.ok for f in findings)
    print(f"shoal doctor: {problems} problem(s)" if problems else "shoal doctor: healthy")
    return 1 if problems else 0


async def diagnose(identity: NodeIdentity, agent: str | None, probe_seconds: float) -> list[Finding]:
    """Every finding about this PC: its certificate, its agent, the members it knows, multicast."""
    loop = asyncio.get_running_loop()
    cert, ca = identity.certificate(), read_certificate(identity.ca)
    keeper = await loop.run_in_executor(None, revocation_keeper, identity.cert.parent, ca)
    revoked = keeper.current is not None and keeper.current.revokes(identity.fingerprint)
    findings = check_certificate(cert, ca, _key_matches(identity), revoked, dt.datetime.now(dt.UTC))
    findings += check_idle(*await loop.run_in_executor(None, _idle_source), sys.platform)
    address = agent or running_agent(identity.cert.parent)
    status, error = None, None
    if address is not None:
        try:
            async with asyncio.timeout(ASK_TIMEOUT):
                link = await StatusLink.open(parse_address(address), identity, timeout=PEER_TIMEOUT)
                try:
                    status = await link.get()
                finally:
                    await link.close()
        except (RingError, FleetError) as exc:
            error = str(exc)
        except TimeoutError:
            error = f"no answer within {ASK_TIMEOUT:.0f} s"
    findings += check_agent(address, status, error)
    members: dict[str, Any] | None = status.get("members") if status else None
    if members is None:
        return findings
    peers = [m["address"] for m in members.get("members", []) if m["state"] in ("member", "lost")]
    reach = await asyncio.gather(*(_reach(peer, identity) for peer in peers))
    from agent.daemon import software_version  # the daemon is not imported at every start for this

    findings += check_members(members, software_version(), dict(zip(peers, reach, strict=True)))
    mdns = members.get("mdns")
    probes: list[MulticastProbe] = []
    if mdns is not None:
        probes = list(await asyncio.gather(*(_probe(a, identity.fleet_id, probe_seconds) for a in mdns["addresses"])))
    findings += check_multicast(probes, mdns is not None, members)
    return findings


def _idle_source() -> tuple[str | None, float | None, str]:
    """The idle source this PC's agent would pick, its reading, and why the others before it failed."""
    tried: list[IdleSource] = []
    picked = pick_source(os.environ, tried=tried)
    seconds = picked.seconds_since_input() if picked is not None else None
    close = getattr(picked, "close", None)
    if close is not None:
        close()
    return (None if picked is None else picked.name), seconds, describe_problems([s for s in tried if s is not picked])


async def _reach(address: str, identity: NodeIdentity) -> str | None:
    try:
        async with asyncio.timeout(ASK_TIMEOUT):
            link = await StatusLink.open(parse_address(address), identity, timeout=PEER_TIMEOUT)
            await link.close()
    except RingError as exc:
        return str(exc)
    except TimeoutError:
        return f"no answer within {ASK_TIMEOUT:.0f} s"
    return None


async def _probe(address: str, fleet: str, seconds: float) -> MulticastProbe:
    try:
        async with asyncio.timeout(seconds + PROBE_SLACK):
            return await probe_multicast(address, fleet, seconds)
    except TimeoutError:
        return MulticastProbe(address, False, frozenset(), f"the probe took over {seconds + PROBE_SLACK:.0f} s")


def _key_matches(identity: NodeIdentity) -> bool:
    try:
        key = serialization.load_pem_private_key(identity.key.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return False
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    return key.public_key().public_bytes(encoding, public) == identity.certificate().public_key().public_bytes(
        encoding, public
    )
