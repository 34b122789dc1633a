"""``python -m bench soak``: a fleet of real agents serving many requests through three kinds of client, measured.

The fleet (``tests/support/soak_fleet.py``): three stage agents forming their ring from a signed fleet document, a warm
standby, a spare, and a head serving the chat endpoint and the OpenAI API, all ``shoal agent`` processes on loopback,
SmolLM2 int4 in 3 stages. Requests (:func:`plan_requests`): prompts of lengths drawn from a fixed set
(:func:`prompt_lengths`) that the warm-up sends through every stage once, random ``max_tokens``, greedy and sampled, a
share cancelled mid-answer by closing the connection, through the chat endpoint (``agent.chat_client``), the OpenAI API
streamed and whole (the ``openai`` client) and ``shoal ask``, at most ``--concurrency`` at once. Greedy requests draw
their prompts from a small pool whose undisturbed answers are taken first (the warm-up): a greedy answer must be the
reference's first tokens.

Measured after the warm-up, every ``--sample`` seconds, per agent: RSS, open fds, threads, sessions held,
sessions parked; per request: time to the first token and between tokens. The RSS drift measures memory an
agent keeps per request (a leak), not the caches that fill once per input shape: OpenVINO compiles kernels for each
prompt length a stage sees (about 1.3 MB each on SmolLM2), so every length sampled after the warm-up was sent in it,
and the report says how many distinct lengths were sent and how many of them the warm-up had not (``--lengths 0``
draws any length, and then the drift also counts those kernels). ``--chaos`` injects faults while it
serves (``bench/chaos.py``); ``--lab`` runs each agent in its own host of a lab of network namespaces
(root; ``tests/support/soak_lab.py``), where chaos also cuts a host off the network. Goals, each marked pass
or fail: every request ends whole or with a clear error (none hangs past its deadline), every greedy answer is
the reference's, 0 sessions left, RSS drift < 5 %, fds and threads flat. Writes ``soak.json`` and ``soak.md``
(``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import BenchError

CLIENTS = ("chat", "openai-stream", "openai-whole", "ask")
CLIENT_WEIGHTS = (4, 3, 2, 1)
"""``shoal ask`` is a process per request (Python's start costs a second of CPU here): a smaller share."""
CANCELLABLE = ("chat", "openai-stream")
"""Clients that read an answer token by token, so they can close the connection mid-answer."""
CANCEL_SCALE = sum(CLIENT_WEIGHTS) / sum(w for c, w in zip(CLIENTS, CLIENT_WEIGHTS, strict=True) if c in CANCELLABLE)
"""Only these clients cancel: each of their requests is cancelled this much more often than the share asked."""
NOTES = (
    "the ring of office computers keeps a model in stages and each stage runs on a desk that is idle "
    "while its owner is away a head sends prompts through the stages and reads the tokens back the fleet "
    "plans which computer serves which layers and a standby waits with its stage compiled in case one leaves"
)
WORDS = tuple(NOTES.split())
RSS_DRIFT_GOAL = 0.05
IDLE_S = 8.0
"""Seconds the fleet idles after the load before a last look: an agent gives back its heap after 5 s without a step
(``agent.node.heap_trim``)."""
FLAT_SLACK = 3
"""Open fds and threads may move by this much between the first and the last samples and still be flat
(a sample can land while a connection or a worker thread is briefly open)."""


@dataclass(frozen=True)
class SoakPrompt:
    """A prompt's text and the length it was cut to, in tokens (what decides a stage's input shapes)."""

    tokens: int
    text: str


@dataclass(frozen=True)
class SoakRequest:
    """One request of the soak: its client, prompt (its length, and an index into the greedy pool or -1),
    answer length, sampling, and after how many tokens it is cancelled (None: read to the end)."""

    index: int
    client: str
    prompt: str
    prompt_tokens: int
    pool: int
    max_tokens: int
    temperature: float
    seed: int
    cancel_after: int | None


@dataclass
class Outcome:
    """How one request ended: ``whole``, ``error`` (a clear one, in ``detail``), ``cancelled`` (by the client,
    as planned), ``hung`` (no end by the deadline) or ``unclear`` (ended without an answer or a reason)."""

    index: int
    client: str
    greedy: bool
    started: float
    ended: float = 0.0
    status: str = "unclear"
    detail: str = ""
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    pieces: list[str] = field(default_factory=list)
    """The chat endpoint's token texts, one a token (the references' texts of a prefix)."""
    first_token_s: float | None = None
    gaps: list[float] = field(default_factory=list)
    exact: bool | None = None
    matches: bool | None = None

    def summary(self) -> dict[str, Any]:
        row = asdict(self)
        for key in ("tokens", "text", "pieces", "gaps"):
            row.pop(key)
        row["longest_gap_s"] = round(max(self.gaps), 3) if self.gaps else None
        return row


@dataclass(frozen=True)
class SoakSettings:
    requests: int = 1000
    concurrency: int = 3
    max_prompt: int = 2000
    max_answer: int = 64
    cancel_share: float = 0.1
    greedy_share: float = 0.5
    pool: int = 8
    lengths: int = 16
    """Distinct prompt lengths, spread from 8 to ``max_prompt`` and all sent in the warm-up (0: any length)."""
    deadline: float = 300.0
    sample_every: float = 5.0
    chaos: bool = False
    faults: int = 6
    fault_kinds: tuple[str, ...] = ("kill", "stop", "coordinator", "revoke")
    max_hold: float = 30.0
    budget_s: float = 0.0
    """Seconds after which no further request starts (0: none); the report says how many were never sent."""
    seed: int = 46


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = SoakSettings()
    parser.add_argument("--requests", type=int, default=d.requests, help="requests after the warm-up")
    parser.add_argument("--concurrency", type=int, default=d.concurrency, help="requests in flight at most")
    parser.add_argument("--max-prompt", type=int, default=d.max_prompt, help="longest prompt, in tokens")
    parser.add_argument("--max-answer", type=int, default=d.max_answer, help="largest max_tokens")
    parser.add_argument("--cancel-share", type=float, default=d.cancel_share, help="share cancelled mid-answer")
    parser.add_argument("--pool", type=int, default=d.pool, help="prompts of the greedy requests (references)")
    parser.add_argument(
        "--lengths",
        type=int,
        default=d.lengths,
        help="distinct prompt lengths, all sent in the warm-up (0: any length; the drift then counts OpenVINO's "
        "kernels for each new length)",
    )
    parser.add_argument("--deadline", type=float, default=d.deadline, help="seconds a request may take at most")
    parser.add_argument("--sample", type=float, default=d.sample_every, help="seconds between samples")
    parser.add_argument("--chaos", action="store_true", help="inject faults while serving (bench/chaos.py)")
    parser.add_argument("--faults", type=int, default=d.faults, help="with --chaos: faults in all")
    parser.add_argument(
        "--lab", action="store_true", help="each agent in its own network namespace; chaos also cuts a host (root)"
    )
    parser.add_argument(
        "--budget", type=float, default=0.0, help="minutes after which no further request starts (default: none)"
    )
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--export", type=Path, default=None, help="a 3-stage export (default: SmolLM2 int4)")
    parser.add_argument("--out", type=Path, default=None, help="folder of soak.json, soak.md and the agents' logs")


def run_soak_bench(args: argparse.Namespace, cache_dir: Path) -> int:
    from bench.chaos import KINDS, LAB_KINDS
    from bench.plan_bench import _default_export

    settings = SoakSettings(
        requests=args.requests,
        concurrency=args.concurrency,
        max_prompt=args.max_prompt,
        max_answer=args.max_answer,
        cancel_share=args.cancel_share,
        pool=args.pool,
        lengths=args.lengths,
        deadline=args.deadline,
        sample_every=args.sample,
        chaos=args.chaos,
        faults=args.faults,
        fault_kinds=LAB_KINDS if args.lab else KINDS,
        budget_s=args.budget * 60,
        seed=args.seed,
    )
    export = args.export or _default_export(cache_dir)
    with tempfile.TemporaryDirectory() as folder:
        out = Path(args.out or folder)
        out.mkdir(parents=True, exist_ok=True)
        if args.lab:
            from tests.support.soak_lab import soak_in_lab

            report = soak_in_lab(settings, export, cache_dir, out)
        else:
            report = soak(settings, export, cache_dir, out)
        (out / "soak.json").write_text(json.dumps(report, indent=1))
        (out / "soak.md").write_text(markdown(report))
        print(markdown(report))
        print(f"report: {out / 'soak.json'}", file=sys.stderr)
    return 0 if all(g["pass"] for g in report["goals"].values()) else 1


def soak(settings: SoakSettings, export: Path, cache_dir: Path, out: Path, lab: Any = None) -> dict[str, Any]:
    """Form the fleet in ``out`` (in ``lab``'s hosts, a ``NetLab``, when given: run this inside it), run the
    soak, stop the fleet; the report as a JSON-ready dict."""
    from agent.head.chat import ChatTokenizer
    from tests.support.soak_fleet import SoakFleet

    fleet = SoakFleet(out, cache_dir, export, lab)
    began = time.monotonic()
    try:
        plan_hash = fleet.form()
        formed_s = time.monotonic() - began
        tokenizer = ChatTokenizer(export / "tokenizer")
        rng = random.Random(settings.seed)
        lengths = prompt_lengths(settings)
        pool = [_soak_prompt(tokenizer, _draw_length(rng, settings, lengths)) for _ in range(settings.pool)]
        requests = plan_requests(rng, settings, pool, lambda n: _prompt(tokenizer, n), lengths)
        warm = [_soak_prompt(tokenizer, n) for n in warm_up_lengths(lengths, pool)]
        for module in ("openai", "psutil", "bench.chaos", "agent.chat_client.client", "agent.cli.status_link"):
            importlib.import_module(module)  # a second or more of imports, never on the soak's event loop
        report = asyncio.run(_Soak(fleet, settings, pool, requests, warm).run())
    finally:
        fleet.stop_all()
    report.update(
        machine=f"{platform.node()} {platform.machine()}",
        date=time.strftime("%F %R"),
        settings=asdict(settings),
        formed_s=round(formed_s, 1),
        first_plan=plan_hash,
    )
    return report


def _prompt(tokenizer: Any, tokens: int) -> str:
    """About ``tokens`` tokens of text: words cut at that many tokens."""
    rng = random.Random(tokens)
    words = " ".join(rng.choice(WORDS) for _ in range(tokens))
    return "Summarize these notes in one line: " + tokenizer.decode(tokenizer.encode(words)[:tokens])


def _soak_prompt(tokenizer: Any, tokens: int) -> SoakPrompt:
    return SoakPrompt(tokens, _prompt(tokenizer, tokens))


def prompt_lengths(settings: SoakSettings) -> tuple[int, ...]:
    """The soak's prompt lengths, in tokens: ``settings.lengths`` of them spread evenly from 8 to
    ``max_prompt`` (none: any length may be drawn)."""
    if settings.lengths <= 0:
        return ()
    span, k = settings.max_prompt - 8, settings.lengths
    return tuple(sorted({8 + round(span * i / max(1, k - 1)) for i in range(k)}))


def _draw_length(rng: random.Random, settings: SoakSettings, lengths: tuple[int, ...]) -> int:
    return rng.choice(lengths) if lengths else rng.randint(8, settings.max_prompt)


def warm_up_lengths(lengths: tuple[int, ...], pool: list[SoakPrompt]) -> tuple[int, ...]:
    """The lengths the warm-up sends on top of the pool's prompts, so that it has sent every one of ``lengths``."""
    pooled = {p.tokens for p in pool}
    return tuple(n for n in lengths if n not in pooled)


def plan_requests(
    rng: random.Random, settings: SoakSettings, pool: list[SoakPrompt], prompt: Any, lengths: tuple[int, ...] = ()
) -> tuple[SoakRequest, ...]:
    """The soak's requests: clients by weight, greedy ones on the pool's prompts, sampled ones on fresh prompts
    of lengths drawn from ``lengths`` (none: any from 8 to ``max_prompt``), ``cancel_share`` of the streamed ones
    cancelled after a few tokens."""
    made = []
    for index in range(settings.requests):
        client = rng.choices(CLIENTS, CLIENT_WEIGHTS)[0]
        greedy = rng.random() < settings.greedy_share
        which = rng.randrange(len(pool)) if greedy else -1
        chosen = pool[which] if greedy else None
        tokens = chosen.tokens if chosen is not None else _draw_length(rng, settings, lengths)
        text = chosen.text if chosen is not None else prompt(tokens)
        max_tokens = rng.randint(1, settings.max_answer)
        cancel = None
        if client in CANCELLABLE and max_tokens > 2 and rng.random() < settings.cancel_share * CANCEL_SCALE:
            cancel = rng.randint(1, max_tokens - 1)
        made.append(
            SoakRequest(
                index, client, text, tokens, which, max_tokens, 0.0 if greedy else 0.8, rng.randrange(1 << 31), cancel
            )
        )
    return tuple(made)


@dataclass
class _Reference:
    tokens: list[int]
    texts: list[str]

    def expected(self, max_tokens: int) -> tuple[list[int], str]:
        return self.tokens[:max_tokens], "".join(self.texts[:max_tokens])


class _Soak:
    def __init__(
        self,
        fleet: Any,
        settings: SoakSettings,
        pool: list[SoakPrompt],
        requests: tuple[SoakRequest, ...],
        warm: list[SoakPrompt],
    ) -> None:
        from agent.chat_client.endpoint import ChatEndpoint

        self.fleet, self.settings, self.pool, self.requests, self.warm = fleet, settings, pool, requests, warm
        self.endpoint = ChatEndpoint.load(fleet.chat_file)
        self.outcomes: list[Outcome] = []
        self.samples: list[dict[str, Any]] = []
        self.idle: list[dict[str, Any]] = []
        """Each agent's figures ``IDLE_S`` after the load drained: not in the samples, whose drift they would hide."""
        self.references: list[_Reference] = []
        self.began = 0.0
        self.load_over = False
        self.unsent = 0

    async def run(self) -> dict[str, Any]:
        import openai

        from bench.chaos import Chaos, schedule

        # the client's first use builds its SSL context and response types: seconds of CPU, off the loop
        self.model = await asyncio.to_thread(_first_model, self.endpoint.http, self.endpoint.token)
        self.openai = await asyncio.to_thread(
            openai.AsyncOpenAI,
            base_url=self.endpoint.http,
            api_key=self.endpoint.token,
            max_retries=0,
            timeout=self.settings.deadline,
        )
        warm_began = time.monotonic()
        # the warm-up: each pool prompt's undisturbed greedy answer, then a prompt of each length the pool has not
        # (every stage compiles its kernels for each length now, not while the drift is measured)
        for at, prompt in enumerate([*self.pool, *self.warm]):
            asked = SoakRequest(-1, "chat", prompt.text, prompt.tokens, -1, self.settings.max_answer, 0.0, 0, None)
            outcome = await self._chat(asked)
            if outcome.status != "whole":
                raise BenchError(f"the warm-up's answer failed: {outcome.detail}\n{self.fleet.log_tails()}")
            if at < len(self.pool):
                self.references.append(_Reference(outcome.tokens, outcome.pieces))
        warmup_s = time.monotonic() - warm_began
        sampler = asyncio.create_task(self._sample_forever())
        chaos = None
        if self.settings.chaos:
            faults = schedule(
                random.Random(self.settings.seed + 1),
                self.settings.faults,
                len(self.requests),
                self.settings.fault_kinds,
                self.settings.max_hold,
            )
            chaos = Chaos(self.fleet, faults, lambda: len(self.outcomes), lambda: self.load_over)
            chaos_task = asyncio.create_task(chaos.run())
        self.began = began = time.monotonic()
        gate = asyncio.Semaphore(self.settings.concurrency)
        await asyncio.gather(*(self._one(r, gate) for r in self.requests))
        load_s = time.monotonic() - began
        self.load_over = True
        if chaos is not None:
            await chaos_task
        drained_s = await self._drain()
        await self._sample()
        sampler.cancel()
        # a last look after the fleet idled: each agent gives its heap back once no step came for a while
        await asyncio.sleep(IDLE_S)
        self.idle = await self._rows()
        await self.openai.close()
        return self._report(warmup_s, load_s, drained_s, chaos.records if chaos else [])

    async def _one(self, request: SoakRequest, gate: asyncio.Semaphore) -> None:
        async with gate:
            if self.settings.budget_s and time.monotonic() - self.began > self.settings.budget_s:
                self.unsent += 1
                return
            call = {"chat": self._chat, "openai-stream": self._openai, "openai-whole": self._openai, "ask": self._ask}
            outcome = Outcome(request.index, request.client, request.temperature == 0.0, time.monotonic())
            try:
                outcome = await asyncio.wait_for(call[request.client](request), self.settings.deadline)
            except TimeoutError:
                outcome.status, outcome.detail = "hung", f"no end within {self.settings.deadline:g} s"
            except Exception as exc:  # a client's own failure is an unclear end, kept for the report
                outcome.status, outcome.detail = "unclear", f"{type(exc).__name__}: {exc}"
            outcome.ended = outcome.ended or time.monotonic()
            if request.pool >= 0 and outcome.status == "whole":
                tokens, text = self.references[request.pool].expected(request.max_tokens)
                if request.client == "ask":  # shoal ask prints the answer's text without its trailing blanks
                    text, got_text = text.rstrip(), outcome.text.rstrip()
                else:
                    got_text = outcome.text
                outcome.matches = outcome.tokens == tokens if request.client == "chat" else got_text == text
                if not outcome.matches:
                    outcome.detail = f"expected {text!r}, got {got_text!r} (tokens {outcome.tokens or '-'})"[:800]
            self.outcomes.append(outcome)
            if len(self.outcomes) % 25 == 0:
                done = {s: sum(o.status == s for o in self.outcomes) for s in ("whole", "cancelled", "error", "hung")}
                print(
                    f"soak: {len(self.outcomes)} of {len(self.requests)} requests: {done}", file=sys.stderr, flush=True
                )

    def _timed(self, outcome: Outcome, last: float) -> float:
        now = time.monotonic()
        if outcome.first_token_s is None:
            outcome.first_token_s = now - outcome.started
        else:
            outcome.gaps.append(now - last)
        return now

    async def _chat(self, request: SoakRequest) -> Outcome:
        from agent.chat_client.client import ask
        from agent.chat_client.protocol import ChatRequest

        outcome = Outcome(request.index, request.client, request.temperature == 0.0, time.monotonic())
        chat = ChatRequest(
            token=self.endpoint.token,
            messages=(("user", request.prompt),),
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            seed=request.seed,
        )
        last = outcome.started
        async for event in ask(self.endpoint, chat):
            if event.event == "token":
                last = self._timed(outcome, last)
                outcome.tokens.append(int(event.id or 0))
                outcome.pieces.append(event.text)
                if request.cancel_after is not None and len(outcome.tokens) >= request.cancel_after:
                    outcome.status = "cancelled"
                    break  # leaving the loop closes the connection
            elif event.event == "done":
                outcome.status, outcome.exact = "whole", event.stats.get("exact")
            elif event.event == "error":
                outcome.status, outcome.detail = "error", f"{event.code}: {event.text}"
        outcome.text, outcome.ended = "".join(outcome.pieces), time.monotonic()
        if outcome.status == "error" and not (outcome.detail.split(":")[0] and len(outcome.detail) > 10):
            outcome.status = "unclear"
        return outcome

    async def _openai(self, request: SoakRequest) -> Outcome:
        import openai

        outcome = Outcome(request.index, request.client, request.temperature == 0.0, time.monotonic())
        arguments: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": request.prompt}],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "seed": request.seed,
        }
        try:
            if request.client == "openai-whole":
                answer = await self.openai.chat.completions.create(**arguments)
                outcome.text = answer.choices[0].message.content or ""
                outcome.first_token_s = time.monotonic() - outcome.started  # the whole answer's time, not a TTFT
                outcome.status = "whole" if answer.choices[0].finish_reason in ("stop", "length") else "unclear"
            else:
                stream = await self.openai.chat.completions.create(**arguments, stream=True)
                last, chunks, finish = outcome.started, 0, None
                async for chunk in stream:
                    if not chunk.choices:
                        continue
                    if chunk.choices[0].delta.content:
                        last = self._timed(outcome, last)
                        outcome.text += chunk.choices[0].delta.content
                        chunks += 1
                    finish = chunk.choices[0].finish_reason or finish
                    if request.cancel_after is not None and chunks >= request.cancel_after:
                        outcome.status = "cancelled"
                        await stream.close()
                        break
                else:
                    outcome.status = "whole" if finish in ("stop", "length") else "unclear"
                    if outcome.status == "unclear":
                        outcome.detail = f"the stream ended with finish_reason {finish!r}"
        except openai.APIStatusError as exc:
            outcome.status, outcome.detail = "error", f"HTTP {exc.status_code}: {exc.message}"
        except openai.APIError as exc:
            outcome.status, outcome.detail = "error", f"{type(exc).__name__}: {exc.message}"
        outcome.ended = time.monotonic()
        return outcome

    async def _ask(self, request: SoakRequest) -> Outcome:
        outcome = Outcome(request.index, request.client, request.temperature == 0.0, time.monotonic())
        command = [
            "-m", "agent.cli.main", "ask", "--chat-file", str(self.fleet.chat_file),
            "--max-tokens", str(request.max_tokens), "--temperature", str(request.temperature),
            "--seed", str(request.seed), request.prompt,
        ]  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            sys.executable, *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        outcome.text, outcome.ended = out.decode(errors="replace"), time.monotonic()
        if process.returncode == 0:
            outcome.status = "whole"
        else:
            lines = err.decode(errors="replace").strip().splitlines()
            outcome.status = "error" if lines else "unclear"
            outcome.detail = f"exit {process.returncode}: {lines[-1] if lines else ''}"
        return outcome

    async def _sample_forever(self) -> None:
        while True:
            await self._sample()
            await asyncio.sleep(self.settings.sample_every)

    async def _sample(self) -> None:
        self.samples += await self._rows()

    async def _rows(self) -> list[dict[str, Any]]:
        """Every running agent's figures now."""
        import psutil

        rows = []
        at = time.monotonic()
        statuses = await self.fleet.statuses()
        for member in self.fleet.running():
            status = statuses.get(member.name) or {}
            row: dict[str, Any] = {
                "t": round(at, 2),
                "agent": member.name,
                "run": member.starts,
                "stages": tuple(status.get("stages") or ()) if status else None,
            }
            try:
                process = psutil.Process(member.pid)
                row.update(
                    rss_mb=process.memory_info().rss / 2**20, fds=process.num_fds(), threads=process.num_threads()
                )
            except (psutil.Error, TypeError):
                continue
            row.update(
                answered=bool(status),
                sessions=len(status.get("sessions") or []) + int(status.get("local_chats") or 0),
                parked=status.get("parked"),
                running=(status.get("chat") or {}).get("running"),
            )
            rows.append(row)
        return rows

    async def _drain(self, timeout: float = 120.0) -> float:
        """Seconds until every running agent holds no session and the head runs no chat (or ``timeout``)."""
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            statuses = await self.fleet.statuses()
            if all(s is not None for s in statuses.values()) and sum(_held(s) for s in statuses.values()) == 0:
                break
            await asyncio.sleep(0.5)
        return time.monotonic() - began

    def _report(self, warmup_s: float, load_s: float, drained_s: float, faults: list[Any]) -> dict[str, Any]:
        outcomes = sorted(self.outcomes, key=lambda o: o.index)
        counts = {s: sum(o.status == s for o in outcomes) for s in ("whole", "error", "cancelled", "hung", "unclear")}
        streamed = [o for o in outcomes if o.client in ("chat", "openai-stream", "ask")]
        firsts = [o.first_token_s for o in streamed if o.first_token_s is not None and o.client != "ask"]
        gaps = [g for o in streamed for g in o.gaps]
        greedy = [o for o in outcomes if o.matches is not None]
        mismatched = [o.index for o in greedy if not o.matches and o.exact is not False]
        last = {}
        for row in self.samples:
            last[row["agent"]] = row
        left = {name: row["sessions"] + (row["parked"] or 0) + (row["running"] or 0) for name, row in last.items()}
        series = _series(self.samples)
        warmed = {p.tokens for p in [*self.pool, *self.warm]}
        sent = {self.requests[o.index].prompt_tokens for o in outcomes}
        report: dict[str, Any] = {
            "requests": len(outcomes),
            "unsent": self.unsent,
            "outcomes": counts,
            "warmup_s": round(warmup_s, 1),
            # what the RSS drift measures: with no length new after the warm-up, no per-shape kernel cache fills
            "prompt_lengths": {"warm_up": len(warmed), "sent": len(sent), "new_after_warm_up": len(sent - warmed)},
            "load_s": round(load_s, 1),
            "drained_s": round(drained_s, 1),
            "first_token_s": _quantiles(firsts),
            "between_tokens_s": _quantiles(gaps),
            "longest_pause_s": round(max([*gaps, *firsts], default=0.0), 2),
            "greedy_checked": len(greedy),
            "greedy_mismatched": mismatched,
            "inexact_greedy": sum(o.exact is False for o in greedy),
            "sessions_left": left,
            "agents": series,
            "idle_s": IDLE_S,
            "idle_rss_mb": {row["agent"]: round(row["rss_mb"], 1) for row in self.idle},
            "errors": sorted({o.detail for o in outcomes if o.status in ("error", "unclear", "hung")})[:20],
            "mismatches": [o.summary() for o in outcomes if o.matches is False][:20],
            "by_client": {
                c: {s: sum(o.status == s for o in outcomes if o.client == c) for s in counts} for c in CLIENTS
            },
        }
        if self.settings.chaos:
            report["chaos"] = _chaos_report(faults, outcomes, self.settings.fault_kinds)
        report["goals"] = _goals(report)
        report["outcome_rows"] = [o.summary() for o in outcomes]
        report["samples"] = self.samples  # every agent's figures against time: a drift's shape (a plateau, a leak)
        return report


def _first_model(base_url: str, token: str) -> str:
    """The model the head's OpenAI API serves, asked once with the synchronous client (which also imports and
    builds the response types the soak's asynchronous client then uses)."""
    import openai

    with openai.OpenAI(base_url=base_url, api_key=token, max_retries=0, timeout=60) as client:
        return client.models.list().data[0].id


def _held(status: dict[str, Any] | None) -> int:
    if status is None:
        return 0
    chat = status.get("chat") or {}
    return len(status.get("sessions") or []) + int(status.get("parked") or 0) + int(chat.get("running") or 0)


def _quantiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "n": 0}
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 3),
        "p99": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
        "n": len(ordered),
    }


def _series(samples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per agent run (an agent started again is a new run): RSS, fds and threads after the warm-up and at the
    end (medians of the tenth of its samples that follows the first fifth, and of the last tenth), and the drift."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for row in samples:
        runs.setdefault(f"{row['agent']}#{row['run']}", []).append(row)
    found = {}
    for name, rows in runs.items():
        k = max(1, len(rows) // 10)
        settled = rows[len(rows) // 5 :] or rows  # the first fifth fills the KV caches: the warm-up
        first, last = settled[:k], settled[-k:]

        def med(part: list[dict[str, Any]], key: str) -> float:
            return float(statistics.median(r[key] for r in part))

        rss0, rss1 = med(first, "rss_mb"), med(last, "rss_mb")
        found[name] = {
            "samples": len(rows),
            "seconds": round(rows[-1]["t"] - rows[0]["t"], 1),
            "rss_mb": [round(rss0, 1), round(rss1, 1)],
            "rss_drift": round((rss1 - rss0) / rss0, 4),
            "fds": [med(first, "fds"), med(last, "fds")],
            "threads": [med(first, "threads"), med(last, "threads")],
            "max_sessions": max(r["sessions"] for r in rows),
            # a standby that took a stage over, or a stage handed on, holds other weights: no drift to judge
            "same_role": len({r["stages"] for r in rows if r["stages"] is not None}) <= 1,
        }
    return found


def _chaos_report(faults: list[Any], outcomes: list[Outcome], kinds: tuple[str, ...]) -> dict[str, Any]:
    """Faults, and the answers they touched: in flight between a fault's injection and its fleet's one plan."""
    rows = [f.to_json() for f in faults]
    affected: set[int] = set()
    covered: set[int] = set()
    for fault in faults:
        until = fault.ended + (fault.one_plan_s or 0.0)
        hit = {o.index for o in outcomes if o.started <= until and o.ended >= fault.injected}
        affected |= hit
        covered |= hit if fault.covered else set()
    failed = {o.index for o in outcomes if o.status in ("error", "hung", "unclear")}
    lost = sorted(covered & failed)
    touched = [o for o in outcomes if o.index in affected]
    return {
        "faults": rows,
        "injected": sum(not f.note.startswith("not injected") for f in faults),
        "not_injected_on_loopback": [] if "cut" in kinds else ["cut (needs network namespaces: --lab)"],
        "answers_affected": len(affected),
        "answers_lost": len(lost),
        "lost": lost,
        "answers_failed_uncovered": len((affected - covered) & failed),
        "longest_pause_affected_s": round(max((g for o in touched for g in o.gaps), default=0.0), 2),
        "one_plan_s_max": max((f.one_plan_s or 0.0 for f in faults), default=None),
        "one_plan_missed": sum(f.one_plan_s is None for f in faults),
    }


def _goals(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    counts = report["outcomes"]
    stayed = {n: s for n, s in report["agents"].items() if s["samples"] >= 3 and s["same_role"]}
    drift = max((abs(s["rss_drift"]) for s in stayed.values()), default=0.0)
    fds = max((s["fds"][1] - s["fds"][0] for s in stayed.values()), default=0.0)
    threads = max((s["threads"][1] - s["threads"][0] for s in stayed.values()), default=0.0)
    goals = {
        "every request whole or a clear error": {
            "pass": counts["hung"] == 0 and counts["unclear"] == 0,
            "figure": f"{counts['whole']} whole, {counts['error']} clear errors, {counts['cancelled']} cancelled, "
            f"{counts['hung']} hung, {counts['unclear']} unclear",
        },
        "greedy answers equal the undisturbed run": {
            "pass": not report["greedy_mismatched"],
            "figure": f"{report['greedy_checked'] - len(report['greedy_mismatched'])} of {report['greedy_checked']}",
        },
        "0 sessions left": {
            "pass": sum(report["sessions_left"].values()) == 0,
            "figure": str(report["sessions_left"]),
        },
        "RSS drift < 5 % after warm-up": {"pass": drift < RSS_DRIFT_GOAL, "figure": f"largest {drift:.1%}"},
        "fds flat": {"pass": fds <= FLAT_SLACK, "figure": f"largest rise {fds:g}"},
        "threads flat": {"pass": threads <= FLAT_SLACK, "figure": f"largest rise {threads:g}"},
    }
    if "chaos" in report:
        chaos = report["chaos"]
        goals["0 answers lost where a standby existed"] = {
            "pass": chaos["answers_lost"] == 0,
            "figure": f"{chaos['answers_lost']} of {chaos['answers_affected']} affected "
            f"({chaos['answers_failed_uncovered']} failed clearly where no standby stood by)",
        }
        goals["one plan after every fault"] = {
            "pass": chaos["one_plan_missed"] == 0,
            "figure": f"slowest {chaos['one_plan_s_max']} s",
        }
    return goals


def _unsent(report: dict[str, Any]) -> str:
    unsent = report.get("unsent") or 0
    minutes = report.get("settings", {}).get("budget_s", 0) / 60
    return f" ({unsent} more never sent: the {minutes:g}-minute budget ran out)" if unsent else ""


def _lengths_note(report: dict[str, Any]) -> str:
    """What the RSS drift measured: a stage's kernels for a prompt length it had not seen count in it."""
    lengths = report.get("prompt_lengths")
    if not lengths:
        return "Prompt lengths were not counted: the RSS drift may include OpenVINO's kernels for new lengths."
    said = (
        f"Prompts of {lengths['sent']} distinct lengths, {lengths['warm_up']} sent in the warm-up; "
        f"{lengths['new_after_warm_up']} new after it. "
    )
    if lengths["new_after_warm_up"]:
        return (
            said + "The RSS drift includes OpenVINO's kernels for each new length (about 1.3 MB each), not only leaks."
        )
    return said + "The RSS drift measures memory kept per request, not kernels compiled for new prompt lengths."


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables: the goals, the latencies, each agent's run, the faults."""
    s = report.get("settings", {})
    lines = [
        f"Soak of {report['requests']} requests{_unsent(report)} ({s.get('concurrency')} at once, "
        f"prompts up to {s.get('max_prompt')} tokens, max_tokens up to {s.get('max_answer')}"
        f"{', chaos' if s.get('chaos') else ''}); "
        f"{report.get('machine', '')}, {report.get('date', '')}; load {report['load_s']} s",
        "",
        _lengths_note(report),
        "",
        "| goal | figure | pass |",
        "|---|---|---|",
        *(f"| {name} | {g['figure']} | {'pass' if g['pass'] else 'FAIL'} |" for name, g in report["goals"].items()),
        "",
        "| latency | p50 s | p99 s | n |",
        "|---|---|---|---|",
    ]
    for key in ("first_token_s", "between_tokens_s"):
        q = report[key]
        lines.append(f"| {key.removesuffix('_s').replace('_', ' ')} | {q['p50']} | {q['p99']} | {q['n']} |")
    lines += [
        "",
        "| agent#run | seconds | RSS MB first → last | fds | threads | most sessions |",
        "|---|---|---|---|---|---|",
    ]
    for name, a in report["agents"].items():
        role = "" if a["same_role"] else " (its stages changed: drift not judged)"
        lines.append(
            f"| {name}{role} | {a['seconds']} | {a['rss_mb'][0]} → {a['rss_mb'][1]} ({a['rss_drift']:+.1%}) | "
            f"{a['fds'][0]:g} → {a['fds'][1]:g} | {a['threads'][0]:g} → {a['threads'][1]:g} | {a['max_sessions']} |"
        )
    idle = report.get("idle_rss_mb")
    if idle:
        lines += [
            "",
            f"RSS {report['idle_s']:g} s after the load, the fleet idle (a stage gives back its heap after 5 s without "
            "a step): " + ", ".join(f"{name} {mb} MB" for name, mb in idle.items()),
        ]
    if "chaos" in report:
        c = report["chaos"]
        lines += [
            "",
            f"Faults injected: {c['injected']}; answers affected {c['answers_affected']}, lost {c['answers_lost']} "
            f"where a standby stood by, failed with a clear error {c['answers_failed_uncovered']} where none did; "
            f"longest pause a user saw {report['longest_pause_s']} s"
            + "".join(f"; not on loopback: {kind}" for kind in c["not_injected_on_loopback"]),
            "",
            "| fault | target | standby | held | to one plan s | note |",
            "|---|---|---|---|---|---|",
        ]
        for f in c["faults"]:
            held = round(f["ended"] - f["injected"], 1)
            standby = "yes" if f["covered"] else "no"
            lines.append(f"| {f['kind']} | {f['target']} | {standby} | {held} s | {f['one_plan_s']} | {f['note']} |")
    return "\n".join(lines) + "\n"
