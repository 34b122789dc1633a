"""``shoal chat``: chat with the fleet through this PC's agent, and watch the fleet while it answers.

The app holds the state (the conversation on screen, the answer streaming, the settings) and its widgets
show it. Everything that waits runs in a worker: the answer's stream, the status poll (every
``poll_seconds``), the poll of the plan's other agents (their step latency, sessions and memory), the SQLite
store, the admin's changes. Workers post :mod:`tui.events` messages; the handlers here put what they carry
into the widgets. The clock and the data sources are constructor arguments, so tests run the app against fakes
and its screenshots repeat. The admin screen (F3) exists only when an admin source is handed in: the command
line hands one in when this PC holds the fleet's CA key.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Iterable
from typing import Any, ClassVar, TypeVar

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Header

from agent.chat_client.client import progress_line
from tui.admin import AdminSource
from tui.admin_screen import ADMIN_COMMANDS, AdminScreen
from tui.answer import AnswerTally, stats_line
from tui.answer_stream import stream_answer
from tui.conversation import ConversationView
from tui.events import (
    AnswerDone,
    AnswerFailed,
    AnswerProgress,
    AnswerStopped,
    AnswerToken,
    AnswerTurn,
    ConversationLoaded,
    ConversationSaved,
    ConversationsListed,
    PeersPolled,
    SettingsLoaded,
    StatusPolled,
    StoreFailed,
    Thread,
)
from tui.fleet import WAITING, FleetReport
from tui.fleet_polls import FleetPolls
from tui.fleet_view import FleetView
from tui.generation import GenerationSettings
from tui.history import HistoryScreen
from tui.prompt_input import PromptInput
from tui.settings import SettingsScreen
from tui.sources import ChatSource, Clock, PeerStatusSource, StatusSource
from tui.status_line import StatusLine
from tui.store import ConversationStore, title_of
from tui.store_jobs import StoreJobs
from tui.throughput import RateHistory, ThroughputPanel

log = logging.getLogger(__name__)
T = TypeVar("T")

_MAIN_SCREEN_ACTIONS = frozenset({"stop", "new_conversation", "conversations", "settings", "toggle_fleet", "admin"})
PLOT_MINUTES = 3.0


class ChatApp(App[None]):
    """The chat and the fleet side by side on a wide terminal; on a narrow one (80 columns) F2 switches."""

    CSS_PATH = "app.tcss"
    TITLE = "shoal"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]  # noqa: RUF012 - App declares it so
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "stop", "Stop", id="stop"),
        Binding("ctrl+n", "new_conversation", "New", id="new"),
        Binding("ctrl+o", "conversations", "Chats", id="conversations"),
        Binding("ctrl+g", "settings", "Settings", id="settings"),
        Binding("f2", "toggle_fleet", "Fleet", id="fleet"),
        Binding("f3", "admin", "Admin", id="admin"),
        Binding("ctrl+q", "quit", "Quit", id="quit", priority=True),
    ]

    def __init__(
        self,
        chat: ChatSource,
        status: StatusSource,
        store: ConversationStore,
        *,
        clock: Clock = time.time,
        poll_seconds: float = 1.0,
        peers: PeerStatusSource | None = None,
        admin: AdminSource | None = None,
    ) -> None:
        """``peers``: the status of the plan's other agents (None: their own figures show as unknown);
        ``admin``: the fleet admin's source (None: no admin screen)."""
        super().__init__()
        self._chat = chat
        self.admin = admin
        self._clock = clock
        self._polls = FleetPolls(status, peers, poll_seconds)
        self._store = StoreJobs(store, self.post_message)
        self.settings = GenerationSettings()
        self.thread = Thread()
        self.turn: AnswerTurn | None = None
        """The answer streaming now (None: none)."""
        self.fleet: FleetReport = WAITING
        self.rates = RateHistory(window=PLOT_MINUTES * 60)
        # the widgets, made here and kept: handlers reach them even while a dialog is the current screen
        self.conversation = ConversationView(id="conversation")
        self.prompt = PromptInput(id="prompt")
        self.fleet_view = FleetView(id="fleet")
        self.throughput = ThroughputPanel(PLOT_MINUTES, id="throughput")
        self.status_line = StatusLine(id="status")

    # -- layout ----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header(icon="≋")
        with Horizontal(id="body"):
            with Vertical(id="chat-pane"):
                yield self.conversation
                yield self.prompt
            with Vertical(id="fleet-pane"):
                yield self.fleet_view
                yield self.throughput
        yield self.status_line
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = "new conversation"
        self.prompt.focus()
        self._poll_status()
        if self._polls.peers is not None:
            self._poll_peers(self._polls.peers)
        self._with_store(self._store.load_settings())
        self.set_interval(1.0, self._tick)
        self._show_settings()

    async def on_unmount(self) -> None:
        await self._polls.close()

    @property
    def streaming(self) -> bool:
        return self.turn is not None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in _MAIN_SCREEN_ACTIONS and isinstance(self.screen, ModalScreen):
            return False  # a dialog is open: its own keys only
        if action == "stop":
            return self.streaming  # the footer shows Stop only while an answer streams
        if action == "admin":
            return self.admin is not None  # only a holder of the fleet key administers it
        return True

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        if isinstance(screen, AdminScreen):
            for title, help_text, action in ADMIN_COMMANDS:
                yield SystemCommand(title, help_text, getattr(screen, f"action_{action}"))
            yield from super().get_system_commands(screen)
            return
        commands = (
            ("Send the prompt", "Ask the fleet what the prompt says (enter)", self._send_from_palette),
            ("Stop the answer", "Stop the answer streaming now (esc)", self.action_stop),
            ("New conversation", "Start an empty conversation (ctrl+n)", self.action_new_conversation),
            ("Conversations", "Resume or delete a past conversation (ctrl+o)", self.action_conversations),
            ("Generation settings", "Temperature, top-p, top-k, max tokens, seed (ctrl+g)", self.action_settings),
            ("Show the fleet or the chat", "Switch between them on a narrow terminal (f2)", self.action_toggle_fleet),
        )
        for title, help_text, callback in commands:
            yield SystemCommand(title, help_text, callback)
        if self.admin is not None:
            yield SystemCommand("Fleet admin", "Pins, enrolled nodes, join tokens, revocation (f3)", self.action_admin)
        yield from super().get_system_commands(screen)

    # -- actions ----------------------------------------------------------------------------------
    def _send_from_palette(self) -> None:
        self.prompt.action_submit()

    def action_stop(self) -> None:
        """Close the answer's stream: the agent sees its client leave and cancels the answer."""
        if self.turn is not None:
            self.workers.cancel_group(self, "answer")

    async def action_new_conversation(self) -> None:
        self.action_stop()
        self.thread = Thread()
        self.sub_title = "new conversation"
        await self.conversation.show(())
        self.prompt.focus()

    def action_conversations(self) -> None:
        self._with_store(self._store.list_conversations())

    def action_settings(self) -> None:
        def chosen(settings: GenerationSettings | None) -> None:
            if settings is not None and settings != self.settings:
                self.settings = settings
                self._show_settings()
                self._with_store(self._store.save_settings(settings))

        self.push_screen(SettingsScreen(self.settings), chosen)

    def action_toggle_fleet(self) -> None:
        screen = self.screen
        if screen.has_class("-wide"):  # both are shown: move the focus between them
            if self.prompt.has_focus:
                self.fleet_view.stages.focus()
            else:
                self.prompt.focus()
            return
        screen.toggle_class("-show-fleet")
        if screen.has_class("-show-fleet"):
            self.fleet_view.stages.focus()
        else:
            self.prompt.focus()

    def action_admin(self) -> None:
        if self.admin is not None and not isinstance(self.screen, ModalScreen):
            self.push_screen(AdminScreen(self.admin))

    # -- the chat ---------------------------------------------------------------------------------
    @on(PromptInput.Submitted)
    async def _ask(self, event: PromptInput.Submitted) -> None:
        if self.turn is not None:
            self.notify("An answer is still streaming: Esc stops it.", severity="warning")
            event.prompt.text = event.text
            return
        view = self.conversation
        await view.add("user", event.text)
        answer = await view.add("assistant")
        turn = AnswerTurn(self.thread, event.text, self.settings, AnswerTally(self._clock()), answer)
        self.turn = turn
        self.refresh_bindings()
        self._set_chat("waiting for the first token…", "ok")
        throughput = self.throughput
        throughput.streaming, throughput.rate, throughput.ttft = True, None, None
        self._stream_answer(turn)

    @work(group="answer", exclusive=True, exit_on_error=False)
    async def _stream_answer(self, turn: AnswerTurn) -> None:
        await stream_answer(self._chat, turn, self._clock, self.post_message)

    async def on_answer_token(self, message: AnswerToken) -> None:
        turn = message.turn
        turn.tally.token(message.text, message.at)
        self.rates.add(1, message.at)
        self.conversation.follow()
        await turn.view.append(message.text)
        if turn is self.turn:
            self._show_rate(turn, message.at)

    def on_answer_progress(self, message: AnswerProgress) -> None:
        if message.turn is self.turn and message.turn.tally.tokens == 0:
            self._set_chat(progress_line(message.progress), "ok")

    async def on_answer_done(self, message: AnswerDone) -> None:
        turn = message.turn
        tail = message.done.text
        stats = turn.tally.finish(message.done)
        self.conversation.follow()
        if tail:
            await turn.view.append(tail)
        await turn.view.finish(stats_line(stats))
        self._end(turn, f"answered: {stats['tokens']} tokens, {stats['tok_s']:.1f} tok/s", "ok")
        throughput = self.throughput
        throughput.rate, throughput.ttft = stats["tok_s"], stats["ttft"]
        self.rates.answered(stats["tok_s"], self._clock())
        self._tick()
        self._keep(turn, stats)

    async def on_answer_stopped(self, message: AnswerStopped) -> None:
        turn = message.turn
        stats = turn.tally.stopped()
        await turn.view.finish(stats_line(stats))
        self._end(turn, f"stopped after {turn.tally.tokens} tokens", "warning")
        if turn.tally.text:
            self._keep(turn, stats)
        else:
            self._give_back(turn)

    async def on_answer_failed(self, message: AnswerFailed) -> None:
        turn = message.turn
        await turn.view.finish(f"✗ {message.error}", failed=True)
        self._end(turn, message.error, "error")
        self.notify(message.error, title="The answer failed", severity="error", timeout=8)
        self._give_back(turn)

    def _end(self, turn: AnswerTurn, text: str, severity: Any) -> None:
        if turn is self.turn:
            self.turn = None
            self.refresh_bindings()
            self.throughput.streaming = False
        self._set_chat(text, severity)

    def _give_back(self, turn: AnswerTurn) -> None:
        """An unanswered prompt is not history: it goes back into an empty prompt, to send again."""
        prompt = self.prompt
        if not prompt.text.strip():
            prompt.text = turn.prompt

    def _keep(self, turn: AnswerTurn, stats: dict[str, Any]) -> None:
        answer = turn.tally.text
        turn.thread.history.extend((("user", turn.prompt), ("assistant", answer)))
        if not turn.thread.title:
            turn.thread.title = title_of(turn.prompt)
            if turn.thread is self.thread:
                self.sub_title = turn.thread.title
        self._with_store(self._store.save_turn(turn.thread, turn.prompt, answer, stats))

    def _show_rate(self, turn: AnswerTurn, now: float) -> None:
        rate = turn.tally.rate(now)
        throughput = self.throughput
        throughput.rate, throughput.ttft = rate, turn.tally.ttft
        self._set_chat("streaming" + ("" if rate is None else f" · {rate:.1f} tok/s"), "ok")

    def _set_chat(self, text: str, severity: Any) -> None:
        self.status_line.chat = (text, severity)

    def _show_settings(self) -> None:
        if not self.streaming and self.status_line.chat[1] == "ok":
            self._set_chat(self.settings.describe(), "ok")

    def _tick(self) -> None:
        now = self._clock()
        self.throughput.series = tuple(self.rates.series(now))
        self.throughput.fastest = self.rates.fastest(now)
        if self.turn is not None and self.turn.tally.first_token_at is not None:
            self._show_rate(self.turn, now)

    # -- the fleet --------------------------------------------------------------------------------
    @work(group="status", exclusive=True, exit_on_error=False)
    async def _poll_status(self) -> None:
        await self._polls.poll_status(self.post_message)

    @work(group="peers", exclusive=True, exit_on_error=False)
    async def _poll_peers(self, peers: PeerStatusSource) -> None:
        await self._polls.poll_peers(peers, self.post_message)

    def on_status_polled(self, message: StatusPolled) -> None:
        self._show_fleet(self._polls.status_polled(message))

    def on_peers_polled(self, message: PeersPolled) -> None:
        if (report := self._polls.peers_polled(message)) is not None:
            self._show_fleet(report)

    def _show_fleet(self, report: FleetReport) -> None:
        before, self.fleet = self.fleet, report
        self.fleet_view.report = report
        self.status_line.fleet = (report.headline, report.severity)
        if report.severity == "error" and report.banner != before.banner:
            self.notify(report.banner, title="Fleet", severity="error", timeout=6)

    # -- the store --------------------------------------------------------------------------------
    @work(group="store", exit_on_error=False)
    async def _with_store(self, job: Awaitable[None]) -> None:
        """Run one of :class:`StoreJobs`' jobs (they post what they learn)."""
        await job

    def on_conversations_listed(self, message: ConversationsListed) -> None:
        def chosen(conversation: int | None) -> None:
            if conversation is not None:
                self._with_store(self._store.load_conversation(conversation))

        self.push_screen(HistoryScreen(message.conversations, self._clock()), chosen)

    async def on_conversation_loaded(self, message: ConversationLoaded) -> None:
        self.action_stop()
        loaded = message.conversation
        self.thread = Thread(loaded.id, loaded.title, list(loaded.history()))
        self.sub_title = loaded.title
        await self.conversation.show(loaded.messages)
        self.prompt.focus()

    async def on_history_screen_delete(self, message: HistoryScreen.Delete) -> None:
        self._with_store(self._store.delete_conversation(message.conversation))
        if self.thread.id == message.conversation:
            await self.action_new_conversation()

    def on_conversation_saved(self, message: ConversationSaved) -> None:
        if message.thread is self.thread and message.thread.title:
            self.sub_title = message.thread.title

    def on_settings_loaded(self, message: SettingsLoaded) -> None:
        self.settings = message.settings
        self._show_settings()

    def on_store_failed(self, message: StoreFailed) -> None:
        self.notify(message.error, title="Conversations", severity="error", timeout=8)
        self._set_chat(message.error, "error")
