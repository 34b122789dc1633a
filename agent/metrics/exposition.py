"""The agent's ``/metrics``: its status document in the Prometheus text format, through ``prometheus_client``.

Nothing is counted twice: every figure is read, at scrape time, from the status the agent already keeps
(``shoal status`` shows the same numbers). :class:`StatusCollector` is a ``prometheus_client`` collector
over a function that returns that document, registered in a registry of its own per agent (no global
registry: two agents in one process, as in the tests, expose their own figures).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from discovery.announcement import DONOR_STATES
from discovery.membership import MemberState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The exposition format's media type (what Prometheus expects of a ``/metrics`` answer)."""

StatusSource = Callable[[], Mapping[str, Any]]


class StatusCollector(Collector):
    """Metric families made from one agent's status document, each time Prometheus scrapes."""

    def __init__(self, status: StatusSource) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        node = str(status.get("node", ""))
        yield from _stage_metrics(status, node)
        chat = status.get("chat")
        if isinstance(chat, Mapping):
            yield from _chat_metrics(chat, node)
        yield _errors([status.get(section) for section in ("chat", "http", "metrics")], node)
        if isinstance(members := status.get("members"), Mapping):
            yield from _member_metrics(members, node)
        if isinstance(plan := status.get("plan"), Mapping):
            yield from _plan_metrics(plan, node)
        if isinstance(donor := status.get("donor"), Mapping) and donor.get("state"):
            yield _donor_metrics(donor, node)


def render_metrics(status: StatusSource) -> Callable[[], bytes]:
    """A function that renders ``status`` as a Prometheus exposition, with a registry of its own."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(status))
    return lambda: generate_latest(registry)


def _counter(name: str, doc: str, node: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=["node"])
    family.add_metric([node], value)
    return family


def _gauge(name: str, doc: str, node: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["node"])
    family.add_metric([node], value)
    return family


def _stage_metrics(status: Mapping[str, Any], node: str) -> Iterator[Metric]:
    """The stages' figures count their ring work and the work they do in-process for the agent's own chats
    (a head holding stage 0 computes it for its chats without a ring step)."""
    chat = status.get("chat")
    own_sessions = chat.get("local_sessions") or 0 if isinstance(chat, Mapping) else 0
    yield _gauge(
        "shoal_sessions_open",
        "Sessions this agent's stages hold: the ring's (parked included) and its own chats' (kept included).",
        node,
        len(status.get("sessions") or []) + own_sessions,
    )
    yield _gauge("shoal_sessions_parked", "Sessions kept between a chat's turns.", node, status.get("parked") or 0)
    yield _gauge(
        "shoal_sessions_max", "Sessions this agent can hold (--max-sessions).", node, status.get("max_sessions") or 0
    )
    yield _counter(
        "shoal_sessions_evicted",
        "Parked sessions evicted for a session that needed the place.",
        node,
        status.get("evicted") or 0,
    )
    yield _counter(
        "shoal_stage_steps",
        "Steps this agent's stages computed: ring steps, and its own chats' steps computed in-process.",
        node,
        (status.get("steps_served") or 0) + (status.get("local_steps") or 0),
    )
    yield _counter(
        "shoal_stage_compute_seconds",
        "Seconds those steps computed.",
        node,
        (status.get("compute_seconds") or 0.0) + (status.get("local_compute_seconds") or 0.0),
    )
    own = chat if isinstance(chat, Mapping) else {}
    yield _counter(
        "shoal_stage_packs",
        "Inferences of this agent's stages that packed the steps of several sessions (or one, alone): the ring's "
        "and its own chats'.",
        node,
        (status.get("packs") or 0) + (own.get("local_packs") or 0),
    )
    yield _counter(
        "shoal_stage_packed_steps",
        "Steps (or prompt chunks) those packs held: divided by shoal_stage_packs, the steps per pack.",
        node,
        (status.get("packed_steps") or 0) + (own.get("local_packed_steps") or 0),
    )
    times = status.get("step_seconds")
    if isinstance(times, Mapping) and times.get("le"):
        family = HistogramMetricFamily(
            "shoal_stage_step_seconds", "Duration of one step on this agent's stages.", labels=["node"]
        )
        buckets = [(_bound(b), float(c)) for b, c in zip(times["le"], times["counts"], strict=True)]
        buckets.append(("+Inf", float(times["count"])))
        family.add_metric([node], buckets, sum_value=float(times["sum"]))
        yield family


def _chat_metrics(chat: Mapping[str, Any], node: str) -> Iterator[Metric]:
    totals: Mapping[str, int] = chat.get("totals") or {}
    yield _counter("shoal_chat_answers", "Answers this agent headed to their end.", node, chat.get("answered") or 0)
    yield _gauge("shoal_chat_running", "Answers being generated now.", node, chat.get("running") or 0)
    yield _gauge("shoal_chat_kept", "Conversations kept for their next turn.", node, chat.get("kept") or 0)
    for key, doc in (
        ("tokens", "Tokens generated in answers."),
        ("prompt_tokens", "Prompt tokens of answered requests."),
        ("cached_tokens", "Prompt tokens reused from a kept conversation instead of computed."),
        ("steps", "Steps the head's generation loop sent through the ring."),
        ("drafted", "Tokens drafted for speculative decoding."),
        ("accepted", "Drafted tokens the target model accepted."),
    ):
        yield _counter(f"shoal_chat_{key}", doc, node, totals.get(key, 0))
    yield _counter(
        "shoal_chat_answer_seconds",
        "Seconds from request to the end of each answer, all told.",
        node,
        chat.get("answer_seconds") or 0.0,
    )
    yield _counter(
        "shoal_chat_replays",
        "Answers replayed into a fresh session after a lost ring.",
        node,
        chat.get("replayed") or 0,
    )
    drafted = totals.get("drafted", 0)
    yield _gauge(
        "shoal_chat_acceptance_ratio",
        "Accepted / drafted tokens over every answer.",
        node,
        totals.get("accepted", 0) / drafted if drafted else 0.0,
    )
    yield _gauge(
        "shoal_chat_k", "The median K (tokens drafted per step) of the last answer.", node, chat.get("last_k") or 0.0
    )


def _errors(sections: list[Any], node: str) -> Metric:
    """Every refusal, by code: answers that ended in an error and requests the chat endpoint refused (the chat
    service's count), requests the HTTP API refused before an answer began, and those the metrics endpoint
    refused (each section's own ``refused``)."""
    counts: Counter[str] = Counter()
    for section in sections:
        if isinstance(section, Mapping):
            counts.update(section.get("refused") or {})
    errors = CounterMetricFamily(
        "shoal_chat_errors",
        "Requests refused (chat endpoint, API, metrics endpoint) and answers that ended in an error, by code.",
        labels=["node", "code"],
    )
    for code, count in sorted(counts.items()):
        errors.add_metric([node, code], count)
    return errors


def _member_metrics(members: Mapping[str, Any], node: str) -> Iterator[Metric]:
    family = GaugeMetricFamily(
        "shoal_fleet_members", "Other agents this agent knows, by state.", labels=["node", "state"]
    )
    # every state, known or not: a ring wired by hand knows nobody, and says 0 rather than nothing
    counts: Counter[str] = Counter({str(state): 0 for state in MemberState})
    counts.update(str(member.get("state")) for member in members.get("members") or [])
    for state, count in sorted(counts.items()):
        family.add_metric([node, state], count)
    yield family


def _plan_metrics(plan: Mapping[str, Any], node: str) -> Iterator[Metric]:
    yield _gauge(
        "shoal_plan_ready", "1 when every stage of the fleet's plan is ready.", node, 1 if plan.get("ready") else 0
    )
    stages = plan.get("stages") or []
    yield _gauge("shoal_plan_stages", "Stages of the plan.", node, len(stages))
    yield _gauge(
        "shoal_plan_uncovered",
        "Stages the plan gives to nobody.",
        node,
        sum(1 for s in stages if s.get("node") is None),
    )
    yield _gauge("shoal_plan_epoch", "The plan's epoch (raised by every new plan).", node, plan.get("epoch") or 0)


def _donor_metrics(donor: Mapping[str, Any], node: str) -> Metric:
    family = GaugeMetricFamily(
        "shoal_donor_state",
        "1 for what this donor PC does now (serving; draining, away or off: its owner is back or it may not serve).",
        labels=["node", "state"],
    )
    for state in DONOR_STATES:
        family.add_metric([node, state], 1 if donor.get("state") == state else 0)
    return family


def _bound(value: float) -> str:
    return repr(float(value))
