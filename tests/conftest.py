"""Shared fixtures: real exports of SmolLM2 (made once per test session) and the HF reference.

Exports are the expensive part of the suite, so each (stages, weights) export is built at most
once per session, under pytest's session temp folder, through the same code path as
``shoal export``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.leaks import (
    Baseline,
    TaskLedger,
    created_here,
    release_logged_frames,
    starts_recorded,
    sweeps_recorded,
)

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
]
REFERENCE_PROMPTS = 2
"""How many of PROMPTS the exactness checks against a reference run (``hf_reference`` and the tests' own)."""
REFERENCE_TOKENS = 32
"""Greedy tokens per reference answer: a wrong split, KV cache or rewind shows within a few tokens, while every
token costs a step of each model compared."""


NEEDS = ("openvino", "processes", "root")
"""The markers that say what makes a test slow (pyproject.toml describes each): a test with one is ``slow``,
any other ``fast``, so ``-m fast`` and ``-m "not slow"`` select the same tests."""
MODEL_FIXTURES = frozenset({"exported", "hf_model", "hf_reference", "chat_ids", "smollm2_gguf"})
"""A test that uses one of these fixtures needs a real model (``openvino``)."""
SLOW_FOLDERS = ("integration", "lab")
"""Folders whose every test must name what it needs (an unmarked test there would count as fast); tests/lab's
need root by what the folder is (agents in network namespaces), so they are marked ``lab`` and ``root`` here."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    unmarked = []
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.openvino)
        if "lab" in item.path.parts:
            item.add_marker(pytest.mark.lab)
            item.add_marker(pytest.mark.root)
        if any(item.get_closest_marker(need) for need in NEEDS):
            item.add_marker(pytest.mark.slow)
        else:
            item.add_marker(pytest.mark.fast)
            if any(folder in item.path.parts for folder in SLOW_FOLDERS):
                unmarked.append(item.nodeid)
    if unmarked:
        raise pytest.UsageError(
            f"tests in tests/integration or tests/lab must say what they need ({', '.join(NEEDS)}): "
            + ", ".join(unmarked[:5])
        )


@pytest.fixture(scope="session", autouse=True)
def _quiet() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in ("nncf", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # Importing OpenVINO may start openvino_telemetry's worker thread, which lives to the end of the process:
    # imported here, before any test, it is never taken for a thread that a test leaked (``_loop_watch``).
    import openvino  # noqa: F401


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shoal-cache")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from shards.checkpoint.known_models import smollm2_gguf

    return smollm2_gguf()


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Callable[..., Path]:
    """``exported(stages, weights, **extra)`` -> folder of a SmolLM2 export, built once per session.

    The int4 3-stage export also carries a 4-layer self-draft, so that the draft tests reuse it
    instead of paying for one more export.
    """
    from shards.export.exporter import ExportRequest, export

    root = tmp_path_factory.mktemp("exports")
    made: dict[tuple[object, ...], Path] = {}

    def make(stages: int, weights: str = "fp32", **extra: object) -> Path:
        if (stages, weights) == (3, "int4"):
            extra.setdefault("self_draft_layers", 4)
        key = (stages, weights, *sorted(extra.items()))
        if key not in made:
            suffix = "-".join(f"{k}{v}" for k, v in sorted(extra.items()))
            out = root / f"smollm2-{stages}-{weights}{'-' + suffix if suffix else ''}"
            export(
                ExportRequest(source="smollm2", out_dir=out, stages=stages, weights=weights, **extra),  # type: ignore[arg-type]
                cache_dir,
                progress=False,
            )
            made[key] = out
        return made[key]

    return make


@pytest.fixture(scope="session")
def chat_ids(exported: Callable[..., Path]) -> list[list[int]]:
    """Token ids of the test prompts under the export's chat template."""
    from agent.head.chat import ChatTokenizer

    tokenizer = ChatTokenizer(exported(2, "fp32") / "tokenizer")
    return [tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]


@pytest.fixture(scope="session")
def hf_model(smollm2_gguf: Path) -> Any:
    """SmolLM2 in transformers, fp32 torch, in eval mode: the reference the exports are checked against."""
    import functools

    import gguf
    import torch
    from transformers import AutoModelForCausalLM

    from shards.checkpoint.gguf_reader import PlainViewGGUFReader

    # transformers parses the GGUF twice (config, then weights) with gguf-py's reader, and builds gguf-py's
    # tensor-name map once per module: 22 s on a 2-core machine. The plain-view reader reads the same fields
    # and tensors (tests/integration/test_gguf_reader.py) and one map serves every module (a pure function of
    # the architecture and the layer count): 6 s, the same weights and config.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", PlainViewGGUFReader)
        patch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(gguf.get_tensor_name_map))
        return AutoModelForCausalLM.from_pretrained(
            str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
        ).eval()


@pytest.fixture(scope="session")
def hf_reference(hf_model: Any, chat_ids: list[list[int]]) -> list[tuple[list[int], np.ndarray]]:
    """Greedy tokens (REFERENCE_TOKENS, stop tokens ignored) and per-step logits of transformers in fp32 torch,
    for the first REFERENCE_PROMPTS prompts."""
    import torch

    model = hf_model
    results = []
    with torch.no_grad():
        for ids in chat_ids[:REFERENCE_PROMPTS]:
            out = model(torch.tensor([ids]), use_cache=True)
            tokens, logits = [], []
            for _ in range(REFERENCE_TOKENS):
                step_logits = out.logits[0, -1].numpy().copy()
                logits.append(step_logits)
                token = int(step_logits.argmax())
                tokens.append(token)
                out = model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
            results.append((tokens, np.stack(logits)))
    return results


def greedy(session: object, prompt_ids: list[int], n: int = REFERENCE_TOKENS) -> tuple[list[int], np.ndarray]:
    """Greedy decode of exactly ``n`` tokens (stop tokens ignored); returns tokens and step logits."""
    step = session.step  # type: ignore[attr-defined]
    logits = step(np.asarray([prompt_ids], dtype=np.int64))[0, -1].copy()
    tokens, all_logits = [], []
    for _ in range(n):
        all_logits.append(logits)
        token = int(logits.argmax())
        tokens.append(token)
        logits = step(np.asarray([[token]], dtype=np.int64))[0, -1].copy()
    return tokens, np.stack(all_logits)


CALL_FAILED = pytest.StashKey[bool]()
"""Set on a test whose call failed (``pytest_runtest_makereport``), for ``_loop_watch``."""
WATCHED = pytest.StashKey[Baseline]()
"""The running test's baseline (in the config's stash while ``_loop_watch`` runs), for ``pytest_fixture_setup``."""


class _WiderFixtures:
    """Absorbs into the running test's baseline what a fixture of a wider scope set up inside it
    (``request.getfixturevalue`` in its body): a module's or the session's ring is not the test's leak.

    A plugin rather than this conftest's own hook: pytest asks a conftest's hooks only for nodes below its
    folder, and a session-scoped fixture's request belongs to the session, at the root."""

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, Any, Any]:
        value = yield
        baseline = request.config.stash.get(WATCHED, None)
        if baseline is not None and fixturedef.scope != "function":
            baseline.absorb()
        return value


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_WiderFixtures(), "shoal-wider-fixtures")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        item.stash[CALL_FAILED] = True
    return report


BLOCKED_LOOP_SECONDS = 1.0
"""A callback or task step that holds the event loop longer than this fails its test (see ``_loop_watch``).
A blocking call (a compile, an inference, a file hashed) takes seconds; under coverage on a slow 2-core VM an
honest step (a Textual repaint, a draft model's bookkeeping) took 0.5-0.9 s, so 0.5 s failed tests by chance."""


class _WatchedLoop(asyncio.SelectorEventLoop):
    """An event loop that logs each step slower than the threshold, as asyncio's debug mode does, without the
    rest of that mode.

    The loop's own ``_debug`` flag times every step and checks that no other thread calls it; ``get_debug()``
    is what futures, handles and tasks ask before they record the stack that made them, and that recording
    tripled the time of the fast tier's decode loops (the stack is only for messages this watch never needs).
    """

    def __init__(self, ledger: TaskLedger) -> None:
        super().__init__()
        self._debug = True
        self.slow_callback_duration = BLOCKED_LOOP_SECONDS
        self._ledger = ledger
        ledger.note_loop(self)

    def get_debug(self) -> bool:
        return False

    def create_task(self, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        # where each task was made, for the leak guard's message: one frame walk, where debug mode would keep
        # a whole stack for every task
        task = super().create_task(coro, **kwargs)
        self._ledger.note_task(task, created_here())
        return task


class _WatchedLoopPolicy(asyncio.DefaultEventLoopPolicy):
    """Every new event loop is a ``_WatchedLoop`` whose tasks go in ``ledger``."""

    def __init__(self, ledger: TaskLedger) -> None:
        super().__init__()
        self._ledger = ledger

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _WatchedLoop(self._ledger)


class _SlowStepRecorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.slow: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing") and " took " in message:
            self.slow.append(message)


class _CollectionTimer:
    """A ``gc.callbacks`` entry that keeps the longest collection's time, to tell a blocking call in a
    loop step from a garbage collection that happened to land in it."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.longest_s = max(self.longest_s, time.perf_counter() - self._started)


@pytest.fixture(autouse=True)
def _loop_watch(request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail a test whose event loop was blocked (a blocking call on it) or that left something running: an
    asyncio task, a thread, an open file descriptor (``tests/support/leaks.py``).

    As python-zeroconf's fixtures do: blocking calls belong in an executor, and a test must stop every task and
    thread it starts and close what it opens.
    """
    fast = request.node.get_closest_marker("slow") is None
    recorder = _SlowStepRecorder()
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.addHandler(recorder)
    previous = asyncio.get_event_loop_policy()
    baseline = Baseline.take()
    asyncio.set_event_loop_policy(_WatchedLoopPolicy(baseline.ledger))
    # A full garbage collection of everything earlier tests left can take longer than the threshold, and
    # it lands in whatever loop step allocates at that moment: in the quick tiers, collect between tests
    # (the slow tier's tests hold models whose cycles must be freed as they go, so there the collector runs,
    # but over this test's objects only: what the suite built before it is frozen out of the collector's
    # scans (the likely cause of two 1.1-1.2 s steps inside a Textual app's start, seen only in CI's full
    # run), and is unfrozen when the test ends)
    paused_gc = fast and gc.isenabled()
    frozen_gc = not fast
    if paused_gc:
        gc.disable()
    if frozen_gc:
        gc.freeze()
    collections = _CollectionTimer()
    gc.callbacks.append(collections)
    request.config.stash[WATCHED] = baseline
    try:
        with sweeps_recorded(baseline.ledger), starts_recorded(baseline.ledger):
            yield
    finally:
        del request.config.stash[WATCHED]
        if paused_gc:
            gc.enable()
        if frozen_gc:
            gc.unfreeze()
        gc.callbacks.remove(collections)
        asyncio.set_event_loop_policy(previous)
        asyncio_log.removeHandler(recorder)
    problems = []
    if recorder.slow:
        problems.append(
            f"the event loop was blocked: {recorder.slow[0]} ({collections.longest_s:.3f} s was the "
            "test's longest garbage collection)"
        )
    # Tasks, threads and descriptors are checked in every tier. What the test logged with an exception is kept by
    # pytest to the end of its teardown, frames and their locals too (a stopped agent's server and its compiled
    # stages, whose OpenVINO files stay open): those frames are cleared first.
    # A failed test's traceback holds its frames, and with them whatever it had open: its failure is the news.
    for when in ("setup", "call", "teardown"):
        release_logged_frames(caplog.get_records(when))
    problems.extend(baseline.leaks(fds=not request.node.stash.get(CALL_FAILED, False)))
    if problems:
        pytest.fail("; ".join(problems), pytrace=False)
