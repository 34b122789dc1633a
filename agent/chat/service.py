"""``ChatService``: the agent of the PC where the user chats is the head of that conversation.

The agent serves a chat endpoint on loopback (``agent.chat_client.protocol``). For each request it runs the
generation loop itself: the export's tokenizer and chat template, a drafter, speculative decoding.
Holding stage 0 it computes that stage in-process, on the same compiled graphs and the same one
thread as the ring steps it serves for other heads, and sends hidden states on to the next stage; not
holding it, it sends token ids to stage 0 (``ring_first``). The last stage answers this agent directly,
over its own connection to it. An agent holding every stage answers without a ring.

A chat takes one of the agent's ``max_sessions`` places for as long as it runs (its KV state lives on
this agent's stages): when all are taken the user gets "fleet busy", and nobody else is affected.
A client that disconnects cancels its answer, and every stage frees the session. A ring lost mid-answer
does not lose the answer: once the ring is back, its history is replayed into a fresh session.

An answer that ends normally leaves its session on the stages for a while (``agent.chat.kept``): the
conversation's next turn, which repeats everything before its new message, then computes only that
message. A kept session keeps its place, and gives it up at once when another chat or a ring session
needs one here; on the other stages it is parked, and a stage that needs its place for a new session
evicts it (the next turn then starts afresh).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from agent.chat.kept import KeptConversation, KeptConversations
from agent.chat.progress import PromptProgress
from agent.chat.stop_text import StopText
from agent.chat.watch import ClientWatch
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import MAX_LINE_BYTES, Alternative, ChatEvent, ChatRequest, TokenLogprob
from agent.errors import (
    ChatProtocolError,
    ConfigError,
    FleetBusyError,
    PeerUnavailableError,
    PromptTooLongError,
    RingError,
    SessionEvictedError,
)
from agent.head.adaptive_k import AdaptiveK
from agent.head.chat import DEFAULT_MAX_TOKENS, ChatTokenizer, TextStream, check_prompt, check_vocabulary
from agent.head.decode import DecodeStats, decode
from agent.head.drafting import DrafterFactory
from agent.head.resumable import ResumableTarget
from agent.head.ring_client import RingClient, StepDeadline
from agent.head.targets import LocalTarget, Target
from agent.node.config import AgentConfig
from agent.node.server import StageServer
from agent.runtime.pipeline import PipelineSession
from agent.runtime.protocol import new_sessions
from agent.sampling.logprobs import TokenScore
from agent.transport.listen import listen_tcp
from agent.transport.network import Network
from agent.transport.tasks import OwnedTasks
from shards.manifest import Manifest

log = logging.getLogger(__name__)
T = TypeVar("T")

REQUEST_TIMEOUT = 10.0
"""A client must send its request line within this long after connecting."""
RING_TIMEOUT = 15.0
"""How long a chat waits for the rest of the ring to be reachable before it fails."""
PLAN_RING_TIMEOUT = 2.0
"""The same for one attempt on a fleet plan's ring, which is looked up again before the next attempt."""
MAX_REPLAYS = 3
"""Times one answer is replayed into a fresh session after losing its ring (``ChatService._tokens``)."""
REPLAY_WAIT = 120.0
"""How long a replay waits for the ring to answer again (a frozen or restarting stage), tried with backoff."""


@dataclass(frozen=True)
class ChatModel:
    """What a head answers with: the export's manifest and tokenizer, and its drafters."""

    export_dir: Path
    manifest: Manifest
    tokenizer: ChatTokenizer
    drafters: DrafterFactory


Route = Callable[[], tuple[tuple[str, int], tuple[str, int]]]
"""Where a fleet agent's chats go (stage 0, last stage), from the fleet plan; ``PeerUnavailableError`` saying
why while the plan's ring cannot answer."""


@dataclass
class AnswerTally:
    """What an answer went through besides its tokens (reported in its ``done`` event)."""

    replays: int = 0
    """Fresh sessions its history was replayed into after the ring was lost."""
    interruptions: list[str] = field(default_factory=list)
    """Why the ring was lost (which link, what went silent), in order: told in the ``done`` event."""
    exact: bool = True
    """Every session it used computed each step as plain decoding would (``agent.runtime.repeatable``): the
    same question gets the same tokens. False where a stage verified drafts or rewound in a precision and
    thread count that round differently (told in the ``done`` event, counted in the status)."""


@dataclass
class _Answer:
    """One answer under way: what was asked, its prompt, the most new tokens it may have (``budget``), when it
    began, and what it has done so far."""

    request: ChatRequest
    prompt_ids: list[int]
    budget: int
    started: float
    stats: DecodeStats = field(default_factory=DecodeStats)
    tally: AnswerTally = field(default_factory=AnswerTally)
    shown: StopText = field(init=False)
    """The text shown so far, held back where a stop sequence may begin."""

    def __post_init__(self) -> None:
        self.shown = StopText(self.request.stop)


class _Pieces:
    """Token ids as the text of each alone, for log-probabilities (a token is looked up once an answer)."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self._tokenizer = tokenizer
        self._text: dict[int, str] = {}

    def text(self, token: int) -> str:
        if token not in self._text:
            self._text[token] = self._tokenizer.decode([token], skip_special_tokens=False)
        return self._text[token]

    def logprob(self, token: int, score: TokenScore) -> TokenLogprob:
        top = tuple(Alternative(i, self.text(i), lp) for i, lp in score.top)
        return TokenLogprob(self.text(token), score.logprob, top)


async def _until_reachable(
    attempt: Callable[[], Awaitable[T]], wait: float, waiting: Callable[[PeerUnavailableError, float], None]
) -> T:
    """``attempt`` again while it fails with ``PeerUnavailableError``, with backoff (0.1 s, doubling to 2 s), for up
    to ``wait`` seconds; ``waiting`` hears each failure tried again and the delay. The last failure is raised."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    delay = 0.1
    while True:
        try:
            return await attempt()
        except PeerUnavailableError as exc:
            if loop.time() + delay > deadline:
                raise
            waiting(exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


class ChatService:
    """The chat endpoint of one agent, and the head of every conversation it is asked for."""

    def __init__(
        self,
        config: AgentConfig,
        server: StageServer,
        network: Network,
        load_tokenizer: Callable[[Path], ChatTokenizer] | None = None,
        route: Route | None = None,
    ) -> None:
        """``network``: how this head reaches the ring's stages; ``load_tokenizer``: reads the export's
        tokenizer folder (default ``ChatTokenizer``; the middle test tier gives a toy one); ``route``: for an
        agent of a self-forming fleet, where the plan's ring is (its export comes later: :meth:`use_export`).
        Without it the ring is the hand-wired one of ``config``."""
        assert config.chat is not None and config.chat_file is not None
        if route is None and (server.manifest is None or config.export_dir is None):
            raise ConfigError("heading chats needs the export (its tokenizer and the stages' manifest)")
        self.config = config
        self._route = route
        self.model: ChatModel | None = None
        """None until the export is loaded (at start, or once the fleet plan gave one: :meth:`use_export`)."""
        self.server = server
        self.node = server.node
        self._network = network
        self._load_tokenizer = load_tokenizer or ChatTokenizer
        self._client: RingClient | None = None
        self._connecting = asyncio.Lock()
        self._listener: asyncio.Server | None = None
        self._endpoint: ChatEndpoint | None = None
        self._answers = OwnedTasks()
        self.answered = 0
        self.inexact = 0
        """Answers that were not exact (``AnswerTally.exact``)."""
        self.replayed = 0
        """Answers' histories replayed into fresh sessions after a lost ring, all told."""
        self.local_packs = 0
        self.local_packed_steps = 0
        """Packs its chats' steps made on its own stages (``agent.head.local_packer``), and the steps they held."""
        self.totals: Counter[str] = Counter()
        """What every answer given added up to: tokens, prompt and cached tokens, steps, drafts, seconds."""
        self.refused: Counter[str] = Counter()
        """Answers that ended in an error, and requests the chat endpoint refused, by code."""
        self.last_k = 0.0
        """The median K of the last answer (0: none drafted)."""
        self.answer_seconds = 0.0
        """Seconds from request to ``done`` of every answer given, all told."""
        self._prompts: set[PromptProgress] = set()
        """The prompts of the answers still waiting for their first token."""
        self.kept = KeptConversations(self.node, config.chat_keep, config.chat_keep_max, server.table.release)

    @property
    def model_id(self) -> str:
        """The model these chats are answered by (its source's id, as an OpenAI client lists it)."""
        return self.model.manifest.source.id if self.model is not None else "shoal"

    @property
    def _holds_all(self) -> bool:
        """Whether this agent answers its chats alone (a hand-wired agent holding every stage)."""
        model = self.model
        return self._route is None and model is not None and len(self.server.stages) == len(model.manifest.stages)

    @property
    def _holds_first(self) -> bool:
        """Whether the head computes stage 0 in-process (a hand-wired agent serving it; in a self-forming
        fleet the head sends to the plan's stage 0, which may be itself, over its own port)."""
        return self._route is None and self.server.serves and self.server.hello.layer_start == 0

    async def use_export(self, export_dir: Path, manifest: Manifest) -> None:
        """Answer with this export from now on: its tokenizer and drafters load off the event loop (a draft
        model is compiled once, now); a ring client of another export is dropped."""
        loop = asyncio.get_running_loop()
        tokenizer = await loop.run_in_executor(None, self._load_tokenizer, export_dir / "tokenizer")
        drafters = DrafterFactory(self.config.drafter, export_dir, manifest, self.config.runtime)
        await loop.run_in_executor(None, drafters.prepare)
        if self.model is not None and self.model.manifest.export_id != manifest.export_id:
            await self._drop_client()
        self.model = ChatModel(export_dir, manifest, tokenizer, drafters)
        log.info("node=%s heads chats of %s (export %s)", self.node, manifest.source.id, manifest.export_id)

    async def _drop_client(self) -> None:
        async with self._connecting:
            if self._client is not None:
                await self._client.close()
                self._client = None

    async def start(self, http_url: str | None = None) -> tuple[str, int]:
        """Listen on the configured loopback address and write the endpoint file (naming ``http_url``, the
        OpenAI-style API's base URL, if one serves these chats); returns the address."""
        host, port = self.config.chat  # type: ignore[misc]
        if self._route is None:
            assert self.config.export_dir is not None and self.server.manifest is not None
            await self.use_export(self.config.export_dir, self.server.manifest)
        self._listener = await listen_tcp(self._handle, (host, port), "the chat endpoint", limit=MAX_LINE_BYTES + 1)
        bound = self._listener.sockets[0].getsockname()
        self._endpoint = replace(ChatEndpoint.new(bound[0], bound[1]), http=http_url or "")
        self._endpoint.write(self.endpoint_file)
        log.info("node=%s chats on %s:%d (endpoint file %s)", self.node, bound[0], bound[1], self.endpoint_file)
        return bound[0], bound[1]

    @property
    def endpoint_file(self) -> Path:
        assert self.config.chat_file is not None
        return self.config.chat_file

    @property
    def token(self) -> str:
        """The access token every request must carry (from the endpoint file)."""
        assert self._endpoint is not None, "start() first"
        return self._endpoint.token

    async def stop(self) -> None:
        """Stop listening, end the answers in progress (their sessions are freed) and leave the ring."""
        if self._listener is not None:
            self._listener.close()
        await self._answers.cancel_all()
        await self.kept.close_all()
        if self._endpoint is not None:
            with contextlib.suppress(FileNotFoundError):
                self.endpoint_file.unlink()
        if self._client is not None:
            await self._client.close()

    def _not_ready(self) -> str:
        if self._route is None:
            return "the chat service has not started"
        try:
            self._route()
        except PeerUnavailableError as exc:
            return f"the fleet's ring is not ready: {exc}"
        return "the fleet's ring is ready, and this agent is loading the model's tokenizer; try again in a moment"

    def status(self) -> dict[str, Any]:
        """The chat part of the agent's status: where it listens, answers given and running, its own steps."""
        assert self._endpoint is not None
        return {
            "endpoint": f"{self._endpoint.host}:{self._endpoint.port}",
            "http": self._endpoint.http,
            "context_tokens": self.model.manifest.context_tokens if self.model is not None else None,
            "answered": self.answered,
            "inexact": self.inexact,
            "running": self.server.table.local - len(self.kept),
            # the KV states of its chats (running and kept) on its own stages, in-process
            "local_sessions": self.server.table.local if self._holds_all or self._holds_first else 0,
            "local_steps": self.server.local_steps,
            "local_compute_seconds": round(self.server.local_compute_seconds, 6),
            "local_packs": self.local_packs,
            "local_packed_steps": self.local_packed_steps,
            "kept": len(self.kept),
            "replayed": self.replayed,
            "totals": dict(self.totals),
            "refused": dict(self.refused),
            "last_k": self.last_k,
            "answer_seconds": round(self.answer_seconds, 6),
            "resumed": self.kept.resumed,
            "reused_tokens": self.kept.reused_tokens,
            "prompts_in": sorted(p.latest for p in self._prompts if p.latest is not None),
        }

    # -- one client connection -----------------------------------------------------------------
    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._answers.adopt()
        watch: ClientWatch | None = None
        try:
            request = await self._read_request(reader)
            watch = ClientWatch.start(reader)
            async with contextlib.aclosing(self.answer(request)) as events:
                async for event in events:
                    writer.write(event.to_line())
                    await writer.drain()
                    watch.answered_once = True
        except asyncio.CancelledError:
            if watch is None or not watch.absorbed():
                raise
            log.info(
                "node=%s chat client left before its %s",
                self.node,
                "answer was complete" if watch.answered_once else "first token",
            )
        except ChatProtocolError as exc:
            log.warning("node=%s chat request refused: %s", self.node, exc)
            self.refused[exc.code] += 1
            with contextlib.suppress(ConnectionError):
                writer.write(ChatEvent.error(exc.code, str(exc)).to_line())
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            log.info("node=%s chat client left before its answer was complete", self.node)
        except Exception:  # a bug must not go unanswered, nor take the agent down
            log.exception("node=%s chat failed unexpectedly", self.node)
            with contextlib.suppress(ConnectionError):
                writer.write(ChatEvent.error("failed", "internal error in the agent (see its log)").to_line())
                await writer.drain()
        finally:
            if watch is not None:
                watch.stop()
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()

    async def _read_request(self, reader: asyncio.StreamReader) -> ChatRequest:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                line = await reader.readline()
        except TimeoutError as exc:
            raise ChatProtocolError(f"no request within {REQUEST_TIMEOUT:.0f} s") from exc
        except ValueError as exc:  # the stream's limit: a line over MAX_LINE_BYTES
            raise ChatProtocolError(f"request longer than {MAX_LINE_BYTES} bytes") from exc
        request = ChatRequest.from_line(line)
        assert self._endpoint is not None
        if not secrets.compare_digest(request.token.encode(), self._endpoint.token.encode()):
            raise ChatProtocolError("wrong access token (read it from the endpoint file)", code="unauthorized")
        return request

    # -- one answer ----------------------------------------------------------------------------
    async def answer(self, request: ChatRequest) -> AsyncGenerator[ChatEvent, None]:
        """The events of one answer: a ``token`` per generated token, then ``done``; or an ``error``."""
        async with contextlib.aclosing(self._answer(request)) as events:
            async for event in events:
                if event.event == "error":
                    self.refused[str(event.code)] += 1
                yield event

    async def _answer(self, request: ChatRequest) -> AsyncGenerator[ChatEvent, None]:
        if request.seed is None:  # one seed per answer, told in its done event: the answer can be had again
            request = replace(request, seed=secrets.randbits(31))
        model = self.model
        if model is None:
            yield ChatEvent.error("ring_unavailable", self._not_ready())
            return
        prompt = await self._prompt(model, request)
        if isinstance(prompt, ChatEvent):
            yield prompt
            return
        prompt_ids, budget = prompt
        conversation = self.kept.take(prompt_ids, request.sampling)
        if conversation is None and not self.server.table.reserve():
            yield ChatEvent.error(
                "fleet_busy",
                f"fleet busy: {self.node} already holds {self.server.table.capacity} sessions; try again later",
            )
            return
        answer = _Answer(request, prompt_ids, budget, time.perf_counter())
        finished = False
        try:
            if conversation is None:
                conversation = await self._joined(request)
            log.info("node=%s chat of %d prompt tokens started", self.node, len(prompt_ids))
            events = self._tokens(model, conversation, answer)
            async with contextlib.aclosing(events) as tokens:
                async for event in tokens:
                    yield event
            finished = True
        except FleetBusyError as exc:
            yield ChatEvent.error("fleet_busy", str(exc))
            return
        except PeerUnavailableError as exc:
            log.warning("node=%s chat failed: %s", self.node, exc)
            yield ChatEvent.error("ring_unavailable", str(exc))
            return
        except RingError as exc:
            log.warning("node=%s chat failed: %s", self.node, exc)
            yield ChatEvent.error("failed", str(exc))
            return
        finally:
            # An answer that ended normally leaves a session worth keeping; any other may hold half a step.
            # A cancellation (the client left) may land on any await here: the place is given back first,
            # and the session's close is shielded, so neither is lost half-way.
            keeping = False
            try:
                keeping = finished and conversation is not None and await self.kept.keep(conversation, prompt_ids)
            finally:
                if not keeping:
                    self.server.table.release()
                    if conversation is not None:
                        with contextlib.suppress(RingError):
                            await asyncio.shield(conversation.target.close())
        yield self._done(conversation, answer)

    async def _prompt(self, model: ChatModel, request: ChatRequest) -> tuple[list[int], int] | ChatEvent:
        """The request's prompt as token ids and the most new tokens it may have; or the error event refusing it
        (a token the model lacks, a prompt too long for the context)."""
        manifest, tokenizer = model.manifest, model.tokenizer
        # tokenizing a long conversation takes milliseconds to seconds: off the event loop
        loop = asyncio.get_running_loop()
        if request.prompt is not None:  # a completion: the text as it is, with the model's own special tokens
            prompt_ids = await loop.run_in_executor(None, lambda: tokenizer.encode(request.prompt or "", True))
        else:
            prompt_ids = await loop.run_in_executor(None, tokenizer.encode_chat, request.chat_messages())
        try:
            check_vocabulary(prompt_ids, manifest.arch.vocab_size, tokenizer)
            # the refusal names the request's field; a client words it its own way from the figures
            budget = check_prompt(prompt_ids, request.max_tokens, manifest.context_tokens, setting="max_tokens")
        except ChatProtocolError as exc:
            return ChatEvent.error(exc.code, str(exc))
        except PromptTooLongError as exc:
            at_fault = "max_tokens" if exc.lowering_helps else "messages" if request.prompt is None else "prompt"
            return ChatEvent.error("prompt_too_long", str(exc), at_fault, exc.figures)
        if request.max_tokens is None and budget < DEFAULT_MAX_TOKENS:
            log.info(
                "node=%s no max_tokens asked: the answer gets %d new tokens, the room a %d-token prompt leaves in "
                "the %d-token context",
                self.node,
                budget,
                len(prompt_ids),
                manifest.context_tokens,
            )
        return prompt_ids, budget

    def _done(self, conversation: KeptConversation | None, answer: _Answer) -> ChatEvent:
        """The answer's ``done`` event, once it is counted in the service's totals and logged."""
        seconds = time.perf_counter() - answer.started
        self.answered += 1
        answer.tally.exact = answer.tally.exact and conversation is not None and conversation.target.repeatable()
        if not answer.tally.exact:
            self.inexact += 1
        # a replayed answer computed its whole history again: nothing of its prompt was reused
        cached = conversation.target.reused if conversation is not None and not answer.tally.replays else 0
        self.totals.update(
            tokens=answer.stats.tokens,
            prompt_tokens=len(answer.prompt_ids),
            cached_tokens=cached,
            steps=answer.stats.steps + 1,
            drafted=answer.stats.drafted,
            accepted=answer.stats.accepted,
        )
        self.answer_seconds += seconds
        self.last_k = answer.stats.median_k
        log.info(
            "node=%s chat answered: %d tokens in %.2f s, %d steps, %d prompt tokens reused",
            self.node,
            answer.stats.tokens,
            seconds,
            answer.stats.steps + 1,
            cached,
        )
        return ChatEvent(
            "done",
            text=answer.shown.rest(),
            stats={
                "finish_reason": "stop" if answer.shown.stopped or answer.stats.tokens < answer.budget else "length",
                "tokens": answer.stats.tokens,
                "max_tokens": answer.budget,
                "seconds": round(seconds, 4),
                "steps": answer.stats.steps + 1,
                "drafted": answer.stats.drafted,
                "accepted": answer.stats.accepted,
                "median_k": answer.stats.median_k,
                "prompt_tokens": len(answer.prompt_ids),
                "cached_tokens": cached,
                "seed": answer.request.seed,
                "replays": answer.tally.replays,
                "interruptions": answer.tally.interruptions,
                "exact": answer.tally.exact,
            },
        )

    async def _tokens(
        self, model: ChatModel, conversation: KeptConversation, answer: _Answer
    ) -> AsyncGenerator[ChatEvent, None]:
        """The token events of one answer, ``answer.budget`` of them at most (and before its first token, the
        ``progress`` of a prompt cut into chunks: ``PromptProgress``, its seconds counted from ``answer.started``). The
        answer survives two failures without the user losing it:

        - a kept session that a stage evicted (it gave the place to a new session) as this turn took it over
          fails at its first step: the answer starts afresh;
        - the ring lost mid-answer (a stage's PC went away, its agent froze or restarted): once the ring
          answers again (tried with backoff for up to ``REPLAY_WAIT``), the steps the session was answered
          (earlier turns of a kept conversation included) are replayed into a fresh session as they
          were sent (``ResumableTarget.replay_into``), which rebuilds the KV state on every stage position for
          position, and decoding goes on where it stopped. The user sees a pause; the tokens are those of
          an answer never interrupted wherever speculation is exact (``RuntimeConfig.rewind``), sampled ones
          too: their draws are keyed by position (``agent.sampling.keyed``).
        """
        tokenizer = model.tokenizer
        stream = TextStream(tokenizer)
        sent: list[int] = []
        scores: list[TokenScore] | None = [] if answer.request.logprobs is not None else None
        pieces = _Pieces(tokenizer)
        while True:
            history = answer.prompt_ids + sent
            tokens = decode(
                conversation.target,
                history,
                max_tokens=answer.budget - len(sent),
                stop_ids=tokenizer.stop_ids,
                params=answer.request.sampling,
                context_tokens=model.manifest.context_tokens,
                drafter=model.drafters.new(answer.request.sampling),
                k_policy=AdaptiveK(),
                executor=self.server.executor,
                stats=answer.stats,
                turn=conversation.turn,
                scores=scores,
            )
            resumed = bool(conversation.target.held)  # a kept session taken over, not a fresh one
            progress = PromptProgress(answer.started)
            conversation.target.watch_prefill(progress.report if not sent else None)
            self._prompts.add(progress)
            try:
                # a client that leaves ends the loop now
                async with contextlib.aclosing(tokens), contextlib.aclosing(progress.before_first(tokens)) as items:
                    async for item in items:
                        if isinstance(item, ChatEvent):
                            yield item
                            continue
                        sent.append(item)
                        scored = pieces.logprob(item, scores[-1]) if scores and len(scores) == len(sent) else None
                        yield ChatEvent("token", id=item, text=answer.shown.push(stream.push(item)), logprobs=scored)
                        if answer.shown.stopped:  # a stop sequence: the answer ends here, normally
                            break
                return
            except SessionEvictedError:
                if sent or not resumed:
                    raise
                log.info(
                    "node=%s the kept session was evicted as the chat took it over: the chat starts afresh", self.node
                )
                replay = False
            except PeerUnavailableError as exc:
                if answer.tally.replays >= MAX_REPLAYS or self._holds_all:
                    raise
                answer.tally.interruptions.append(str(exc))
                log.warning(
                    "node=%s ring lost after %d tokens of an answer (%s): replaying its steps into a "
                    "fresh session once the ring is back (%d of %d)",
                    self.node,
                    len(sent),
                    exc,
                    answer.tally.replays + 1,
                    MAX_REPLAYS,
                )
                replay = True
            finally:
                self._prompts.discard(progress)
                conversation.target.watch_prefill(None)
            lost = conversation.target
            answer.tally.exact = answer.tally.exact and lost.repeatable()
            if replay:
                fresh = await self._replayed(answer.request, lost, answer.tally)
                answer.tally.replays += 1
                self.replayed += 1
            else:
                fresh = await self._open(answer.request)
            conversation.target, conversation.turn = fresh.target, fresh.turn
            await lost.close()

    async def _replayed(self, request: ChatRequest, lost: ResumableTarget, tally: AnswerTally) -> KeptConversation:
        """A fresh session holding what ``lost`` held, once the ring answers again: tried with backoff for up
        to ``REPLAY_WAIT`` (a stage that froze or restarts takes a while), each failure noted in ``tally``."""

        async def attempt() -> KeptConversation:
            fresh = await self._open(request)
            try:
                fresh.target = await lost.replay_into(fresh.target.inner)
            except PeerUnavailableError:
                with contextlib.suppress(RingError):
                    await fresh.target.close()
                raise
            fresh.target.resume(whole=True)  # the next prompt, history + tokens sent, goes on from all it holds
            log.info("node=%s %d positions replayed: the answer goes on", self.node, len(fresh.target.held))
            return fresh

        def waiting(exc: PeerUnavailableError, delay: float) -> None:
            if str(exc) not in tally.interruptions:
                tally.interruptions.append(str(exc))
            log.info("node=%s replay not possible yet (%s); retrying in %.1f s", self.node, exc, delay)

        try:
            return await _until_reachable(attempt, REPLAY_WAIT, waiting)
        except PeerUnavailableError as exc:
            raise PeerUnavailableError(f"the ring did not answer again within {REPLAY_WAIT:.0f} s: {exc}") from exc

    async def _joined(self, request: ChatRequest) -> KeptConversation:
        """A new chat's session. In a fleet that follows a plan, one attempt on the plan's ring lasts
        ``PLAN_RING_TIMEOUT``: the chat tries again, the plan looked up afresh, for up to ``RING_TIMEOUT`` (a
        stage whose PC just went is taken over by its standby within seconds). Elsewhere one attempt, which retries
        its addresses for ``RING_TIMEOUT`` itself."""
        if self._route is None:
            return await self._open(request)

        def waiting(exc: PeerUnavailableError, delay: float) -> None:
            log.info("node=%s the ring cannot be joined yet (%s); trying again in %.1f s", self.node, exc, delay)

        return await _until_reachable(lambda: self._open(request), RING_TIMEOUT, waiting)

    async def _open(self, request: ChatRequest) -> KeptConversation:
        """A fresh session for one chat (its place on this agent is already held), with the turn its local
        work takes on this agent's core."""
        params = request.sampling
        if self._holds_all:
            loop = asyncio.get_running_loop()
            session = PipelineSession(
                await loop.run_in_executor(self.server.executor, new_sessions, self.server.stages)
            )
            target: Target = LocalTarget(
                session,
                params,
                self.server.executor,
                self.server.exact,
                self.server.count_local_step,
                prefill_chunk=self.config.prefill_chunk,
                alike=self.server.alike,
            )
            turn = None
        else:
            try:
                client = await self._ring()
                target, turn = await client.open_session(params, self._ring_timeout), client.turn
            except RingError as exc:  # joining the ring failed (a busy stage answers only the first step)
                raise PeerUnavailableError(str(exc)) from exc
        return KeptConversation(ResumableTarget(target, params, self.config.prefill_chunk), (), turn)

    async def _ring(self) -> RingClient:
        """This agent's connections to the rest of the ring, made at the first chat (bring-up order is free)."""
        async with self._connecting:
            first, last = self._ring_addresses()
            model = self.model
            assert model is not None
            client = self._client
            if client is not None and (
                (client.first_address, client.last_address) != (first, last)
                or client.manifest.export_id != model.manifest.export_id
            ):
                log.info("node=%s the ring moved (the fleet plan changed): the head reconnects", self.node)
                await client.close()
                self._client = None
            if self._client is None:
                local = self.server.stages if self._holds_first else []
                client = RingClient(
                    model.manifest,
                    first,
                    last,
                    self._network,
                    self.node,
                    local_stages=local,
                    executor=self.server.executor,
                    max_payload=self.config.max_payload,
                    wire_dtype=self.config.wire_dtype,
                    liveness=self.config.liveness,
                    deadline=StepDeadline(self.config.step_timeout),
                    prefill_chunk=self.config.prefill_chunk,
                    on_local_step=self.server.count_local_step,
                    packing=self.config.packing,
                    on_local_pack=self._count_local_pack,
                    make_kv_room=self.server.make_kv_room,
                )
                await client.connect(self._ring_timeout)
                self._client = client
            return self._client

    def _count_local_pack(self, steps: int) -> None:
        self.local_packs += 1
        self.local_packed_steps += steps

    @property
    def _ring_timeout(self) -> float:
        """How long one attempt to reach the ring retries its addresses. A plan's ring is looked up again at
        each attempt (its stage may have moved to a standby): a short attempt, so a replay follows the plan."""
        return PLAN_RING_TIMEOUT if self._route is not None else RING_TIMEOUT

    def _ring_addresses(self) -> tuple[tuple[str, int], tuple[str, int]]:
        """The first stage this head sends to and the last one that answers it (config checked them; in a
        self-forming fleet, the plan names them)."""
        if self._route is not None:
            return self._route()
        config = self.config
        first = config.next if self._holds_first else config.ring_first
        if self.server.is_last:
            host, port = self.server.address
            last: tuple[str, int] | None = (
                "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host,
                port,
            )
        else:
            last = config.ring_last or config.next
        assert first is not None and last is not None  # AgentConfig refuses a chat agent without them
        return first, last
