"""``shoal``: one entry point, one subcommand per job.

Results go to stdout (the completion text, JSON); progress bars, logs and errors to stderr. Any
:class:`~agent.errors.ShoalError` ends in one line ``shoal: error: ...`` and exit status 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from agent.cli.common import (
    EXPORT_MODULES,
    FAST_PREFILL_HELP,
    PREFILL_ATTENTION_HELP,
    REWIND_HELP,
    layer_counts,
    require_extra,
)
from agent.errors import ShoalError
from agent.head.drafters import DRAFTERS
from agent.head.prefill import DEFAULT_PREFILL_CHUNK
from agent.runtime.config import PREFILL_ATTENTIONS, REWINDS

log = logging.getLogger("shoal")


def default_cache_dir() -> Path:
    """Where models, compiled graphs and downloads are cached (``SHOAL_CACHE_DIR`` overrides)."""
    env = os.environ.get("SHOAL_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("shoal"))


def default_data_dir() -> Path:
    """Where fleet identities and agent state live (``SHOAL_DATA_DIR`` overrides)."""
    env = os.environ.get("SHOAL_DATA_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_data_dir("shoal"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shoal", description=__doc__.splitlines()[0])
    parser.add_argument("--cache-dir", type=Path, default=None, help="cache folder (default: platform cache)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug detail to stderr")
    parser.add_argument("--version", action=_Version, help="print shoal's version and exit")
    parser.add_argument(
        "--log-file",
        type=Path,
        default=None,
        help="write the log to this file instead of stderr (and stdout too where there is no console: pythonw)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("export", help="export a checkpoint into per-stage OpenVINO shards")
    p.add_argument("source", help="Hub model id, model folder, .gguf file, or a short name (smollm2)")
    p.add_argument("--stages", type=int, required=True, help="number of pipeline stages")
    p.add_argument("--out", type=Path, required=True, help="export folder to create")
    p.add_argument("--weights", choices=("int4", "int8", "fp16", "fp32"), default="int4")
    drafts = p.add_mutually_exclusive_group()
    drafts.add_argument("--draft", metavar="MODEL", help="also export this smaller model (same tokenizer) as a draft")
    drafts.add_argument("--self-draft", metavar="N", type=int, help="draft = first N layers + final norm + head")
    p.add_argument(
        "--layers",
        type=layer_counts,
        default=None,
        metavar="N,N,...",
        help="layers per stage, first to last (default: the split planner balances them)",
    )
    p.add_argument(
        "--context",
        type=int,
        default=None,
        metavar="N",
        help="positions a conversation may hold, prompt and answer (default: the model's own, cut so that one "
        "session's KV cache stays within 1 GiB on each stage)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing different export")

    p = sub.add_parser("generate", help="answer one chat prompt through every stage of an export, in-process")
    p.add_argument("export_dir", type=Path)
    p.add_argument("prompt")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default="AUTO", help="AUTO, CPU, GPU or NPU")
    p.add_argument("--threads", type=int, default=None, help="CPU inference threads")
    p.add_argument(
        "--precision",
        choices=("auto", "f32", "bf16", "f16"),
        default="auto",
        help="inference precision (f32: token-identical across stage splits, slower)",
    )
    p.add_argument("--fast-prefill", action=argparse.BooleanOptionalAction, default=True, help=FAST_PREFILL_HELP)
    p.add_argument("--prefill-attention", choices=PREFILL_ATTENTIONS, default="paged", help=PREFILL_ATTENTION_HELP)
    p.add_argument("--rewind", choices=REWINDS, default="auto", help=REWIND_HELP)
    p.add_argument("--no-verify", action="store_true", help="skip checking file hashes against the manifest")
    p.add_argument(
        "--drafter",
        choices=DRAFTERS,
        default="auto",
        help="speculative decoding: the export's draft graph, n-gram prompt lookup, n-gram where the "
        "text repeats and the draft model elsewhere, or none "
        "(auto: the draft graph if the export has one, else n-gram)",
    )
    p.add_argument(
        "--draft-export",
        type=Path,
        default=None,
        help="take the draft graph from this export instead (a 1-stage export: that whole model; "
        "another tokenizer drafts through text)",
    )
    p.add_argument("--k", type=int, default=None, help="fixed number of drafted tokens per step (default: adaptive)")
    p.add_argument(
        "--depth",
        type=int,
        default=1,
        help="with --ring: speculative steps in flight at once, drafts continued past unjudged ones",
    )
    p.add_argument(
        "--draft-ahead",
        action="store_true",
        help="with --ring and a draft model: also draft while the ring computes, on a guess at its answer",
    )
    p.add_argument(
        "--ring",
        default=None,
        metavar="ADDR[,ADDR]",
        help="run through agents: HOST:PORT of the first remote stage and of the last (one if the same)",
    )
    p.add_argument("--local-stages", type=int, default=0, help="with --ring: stages this head runs itself")
    p.add_argument("--identity", type=Path, default=None, help="with --ring: this node's identity folder")

    p = sub.add_parser("demo", help="the built-in demo: SmolLM2 in stage shards, a local fleet of agents, the TUI")
    p.add_argument("--model", default="smollm2", help="SOURCE to export (default smollm2)")
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("exports/smollm2-3stage"), help="export folder (reused)")
    p.add_argument("--prompt", default=None, help="with --headless: the question (default: the demo's own)")
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--headless", action="store_true", help="one answer on stdout and exit, instead of the TUI")

    p = sub.add_parser(
        "agent",
        help="join the fleet and serve what its plan asks (a long-running daemon); with an export and --stage, "
        "serve those stages of a hand-wired ring",
    )
    p.add_argument(
        "export_dir", type=Path, nargs="?", default=None, help="an export, for a hand-wired ring (default: none)"
    )
    p.add_argument(
        "--shards-dir",
        type=Path,
        default=None,
        help="where downloaded shards are cached (default: the shared Hugging Face cache)",
    )
    p.add_argument(
        "--donor",
        action="store_true",
        default=None,
        help="a donor's PC: serve only while its owner is away (no keyboard or mouse input), at the lowest "
        "priority; settings in agent.toml's [donor] table",
    )
    p.add_argument(
        "--offer-mb",
        type=int,
        default=None,
        metavar="MIB",
        help="memory this PC gives a shard (default: what it measures free; 0: it only heads chats)",
    )
    p.add_argument(
        "--speed",
        type=float,
        default=None,
        metavar="GFLOPS",
        help="this PC's speed figure for the plan (default: measured once running)",
    )
    p.add_argument("--config", type=Path, default=None, help="TOML file with the same settings as the flags")
    p.add_argument("--stage", type=int, action="append", default=[], help="stage index to serve (repeatable)")
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a fleet member to dial at start (repeatable); without multicast one is enough",
    )
    p.add_argument("--no-mdns", action="store_true", help="neither announce nor browse over mDNS")
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        metavar="POSITIONS",
        help=f"cut a chat's long prompt into chunks of at most this many positions, pipelined through the ring "
        f"(0: one step; default {DEFAULT_PREFILL_CHUNK})",
    )
    p.add_argument(
        "--lost-after", type=float, default=None, metavar="SECONDS", help="a member unheard this long is lost (10)"
    )
    p.add_argument("--identity", type=Path, default=None, help="node identity folder (cert.pem, key.pem, ca.pem)")
    p.add_argument("--listen", default=None, help="HOST:PORT to listen on (default 127.0.0.1:0, any free port)")
    p.add_argument("--next", default=None, help="HOST:PORT of the next stage (not for the last stage)")
    p.add_argument("--device", default=None, help="AUTO, CPU, GPU or NPU")
    p.add_argument("--threads", type=int, default=None, help="CPU inference threads")
    p.add_argument("--precision", choices=("auto", "f32", "bf16", "f16"), default=None)
    p.add_argument("--fast-prefill", action=argparse.BooleanOptionalAction, default=None, help=FAST_PREFILL_HELP)
    p.add_argument("--prefill-attention", choices=PREFILL_ATTENTIONS, default=None, help=PREFILL_ATTENTION_HELP)
    p.add_argument("--rewind", choices=REWINDS, default=None, help=REWIND_HELP)
    p.add_argument("--max-sessions", type=int, default=None, help="sessions held at once (default 8)")
    p.add_argument(
        "--wire-dtype",
        choices=("auto", "f32", "f16"),
        default=None,
        help="hidden states on the wire (default auto: the dtype the stage computes in)",
    )
    p.add_argument("--no-verify", action="store_true", help="skip checking file hashes against the manifest")
    p.add_argument(
        "--chat",
        default=None,
        metavar="HOST:PORT",
        help="head the chats of this PC: serve them on this loopback address (e.g. 127.0.0.1:0)",
    )
    p.add_argument(
        "--http",
        default=None,
        metavar="HOST:PORT",
        help="with --chat: also an OpenAI-style API (/v1/chat/completions) on this loopback address",
    )
    p.add_argument(
        "--metrics",
        default=None,
        metavar="HOST:PORT",
        help="Prometheus /metrics of this agent, stage-only ones too: plain HTTP on loopback (e.g. 127.0.0.1:9464), "
        "HTTPS requiring a fleet certificate on any other address",
    )
    p.add_argument(
        "--chat-file",
        type=Path,
        default=None,
        help="where the chat address and access token are written (default: <data dir>/chat.json)",
    )
    p.add_argument(
        "--ring-first",
        default=None,
        metavar="HOST:PORT",
        help="for chats on an agent that does not serve stage 0: stage 0's address",
    )
    p.add_argument(
        "--ring-last", default=None, metavar="HOST:PORT", help="for chats: the last stage's address (default: --next)"
    )
    p.add_argument(
        "--drafter", choices=DRAFTERS, default=None, help="the drafter of this agent's chats (default ngram)"
    )
    p.add_argument(
        "--chat-keep",
        type=float,
        default=None,
        metavar="SECONDS",
        help="keep a finished chat's session this long, so that the conversation's next turn computes "
        "only its new message (default 120; 0: every turn starts afresh)",
    )
    p.add_argument(
        "--chat-keep-max",
        type=int,
        default=None,
        metavar="N",
        help="chat sessions kept at once; each holds a place on every stage (default 1)",
    )

    p = sub.add_parser("ask", help="ask this PC's agent (started with --chat) for an answer, streamed")
    p.add_argument(
        "prompt", nargs="?", default=None, help="the question; without it, a conversation: one turn per line of stdin"
    )
    p.add_argument(
        "--chat-file", type=Path, default=None, help="the agent's chat endpoint file (default: <data dir>/chat.json)"
    )
    p.add_argument("--system", default=None, help="a system message before the prompt")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="the longest answer, in tokens (default: 256, or what the context leaves after the prompt if less)",
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="text that ends the answer (repeatable, up to 4)"
    )

    p = sub.add_parser("doctor", help="check why this PC does not find the fleet (or it this PC); exit 1 if wrong")
    p.add_argument("--identity", type=Path, default=None, help="this node's identity folder")
    p.add_argument("--agent", default=None, metavar="HOST:PORT", help="the agent to ask (default: the running one)")
    p.add_argument("--probe-seconds", type=float, default=3.0, help="how long each mDNS probe listens (3)")

    p = sub.add_parser("status", help="ask agents what they serve, their members, downloads and the plan")
    p.add_argument("address", nargs="*", help="HOST:PORT of an agent (default: the one running on this PC)")
    p.add_argument("--json", action="store_true", help="the whole status document as JSON")
    p.add_argument("--identity", type=Path, default=None, help="this node's identity folder")

    p = sub.add_parser("fleet", help="the fleet's private CA, node certificates, join tokens and revocations")
    fleet = p.add_subparsers(dest="fleet_command", required=True)
    f = fleet.add_parser("init", help="create the fleet's certificate authority")
    f.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    f.add_argument("--name", default="shoal", help="fleet name written into the CA certificate")
    f.add_argument("--force", action="store_true", help="replace an existing CA (every node must be re-issued)")
    f = fleet.add_parser("issue", help="issue a node certificate signed by the fleet CA")
    f.add_argument("node", help="node name (its certificate's common name)")
    f.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    f.add_argument("--ip", action="append", default=[], help="an IP address of the node (repeatable)")
    f.add_argument("--days", type=int, default=365, help="validity in days")
    f.add_argument("--out", type=Path, default=None, help="identity folder to write (default: <fleet dir>/nodes/NODE)")
    f.add_argument(
        "--force",
        action="store_true",
        help="issue it even if a node of that name is enrolled and not revoked (a renewal); pins then need node ids",
    )
    f = fleet.add_parser(
        "token",
        help="make a one-time join token and print the `shoal join` command for a new PC",
        description="Make a join token. The new PC joins while `shoal fleet serve-enrollment` runs on this PC "
        "(where the fleet CA key is) at the printed address.",
    )
    f.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    f.add_argument("--ttl", default="24h", help="lifetime: 30m, 24h, 7d (default 24h)")
    f.add_argument("--uses", type=int, default=1, help="how many PCs may join with it (default 1)")
    f.add_argument(
        "--address",
        default=None,
        metavar="HOST:PORT",
        help="where serve-enrollment listens, for the printed command (default: this PC's first IPv4 address, "
        "port 7300)",
    )
    f = fleet.add_parser("serve-enrollment", help="let PCs with a join token enroll (runs until Ctrl-C)")
    f.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    f.add_argument("--listen", default="0.0.0.0:7300", metavar="HOST:PORT", help="address (default 0.0.0.0:7300)")
    f = fleet.add_parser("list", help="the enrolled nodes, and which are revoked")
    f.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    f.add_argument(
        "--agent", default=None, metavar="HOST:PORT", help="add each node's state and last heard, as this agent sees it"
    )
    f.add_argument("--identity", type=Path, default=None, help="this PC's identity folder (to reach --agent)")
    f = fleet.add_parser("revoke", help="revoke a node's certificates (writes the signed revocation list)")
    f.add_argument("node", help="node name or node id")
    f.add_argument("--dir", type=Path, default=None, help="fleet folder (default: <data dir>/fleet)")
    f.add_argument(
        "--push",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="hand the new list to this running agent (repeatable); it gossips it to every member",
    )
    f.add_argument(
        "--drop-pins",
        action="store_true",
        help="also remove the pins that name only the revoked node from the fleet document (the plan ignores them)",
    )
    f.add_argument("--identity", type=Path, default=None, help="this PC's identity folder (to reach --push)")

    from agent.cli.chat_cmd import add_chat_command
    from agent.cli.plan_cmd import add_plan_commands
    from agent.cli.publish_cmd import add_publish_command

    add_plan_commands(sub, fleet)
    add_publish_command(sub)
    add_chat_command(sub)
    from agent.cli.service_cmd import add_service_command

    add_service_command(sub)
    p = sub.add_parser("join", help="enroll this PC in a fleet with a join token (from `shoal fleet token`)")
    p.add_argument("address", metavar="TOKEN@HOST:PORT", help="the token and the enrollment server's address")
    p.add_argument("--name", default=None, help="this PC's node name (default: its host name)")
    p.add_argument("--out", type=Path, default=None, help="identity folder (default: <data dir>/fleet/nodes/NAME)")
    p.add_argument(
        "--ip", action="append", default=[], help="an IP address of this PC for its certificate (repeatable)"
    )

    p = sub.add_parser("bench", help="measure this PC (the benchmark harness is python -m bench, beside tests/)")
    bench = p.add_subparsers(dest="bench", required=True)
    b = bench.add_parser("stages", help="each stage's decode time back to back, beside the split planner's estimate")
    from agent.measure.stages import add_arguments as add_stages_arguments

    add_stages_arguments(b)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(
        logging.DEBUG if args.verbose else logging.INFO if args.command == "agent" else logging.WARNING, args.log_file
    )
    cache_dir = args.cache_dir or default_cache_dir()
    return run_reporting_errors("shoal", lambda: _run_command(args, cache_dir))


def _run_command(args: argparse.Namespace, cache_dir: Path) -> int:
    if args.command == "export":
        require_extra("shoal export", "export", EXPORT_MODULES)
        from agent.cli.export_cmd import run_export

        return run_export(args, cache_dir)
    if args.command == "generate":
        from agent.cli.generate_cmd import run_generate

        return run_generate(args, cache_dir, default_data_dir())
    if args.command == "demo":
        require_extra("shoal demo (it exports the demo model)", "export", EXPORT_MODULES)
        from agent.cli.demo_cmd import DEFAULT_PROMPT, run_demo

        args.prompt = args.prompt or DEFAULT_PROMPT
        return run_demo(args, cache_dir, default_data_dir())
    if args.command == "agent":
        from agent.cli.agent_cmd import run_agent

        return run_agent(args, cache_dir, default_data_dir())
    if args.command == "ask":
        from agent.cli.ask_cmd import run_ask

        return run_ask(args, default_data_dir())
    if args.command == "chat":
        from agent.cli.chat_cmd import run_chat

        return run_chat(args, default_data_dir())
    if args.command == "doctor":
        from agent.cli.doctor_cmd import run_doctor

        return run_doctor(args, default_data_dir())
    if args.command == "status":
        from agent.cli.status_cmd import run_status

        return run_status(args, default_data_dir())
    if args.command in ("pin", "unpin", "pins") or (args.command == "fleet" and args.fleet_command == "serve"):
        from agent.cli.plan_cmd import run_plan_command

        return run_plan_command(args, default_data_dir())
    if args.command == "publish":
        from agent.cli.publish_cmd import run_publish

        return run_publish(args)
    if args.command == "fleet":
        from agent.cli.fleet_cmd import run_fleet

        return run_fleet(args, default_data_dir())
    if args.command == "join":
        from agent.cli.join_cmd import run_join

        return run_join(args, default_data_dir())
    if args.command == "service":
        from agent.cli.service_cmd import run_service

        return run_service(args, default_data_dir())
    if args.command == "bench":
        from agent.measure.stages import run_bench_stages

        return run_bench_stages(args, cache_dir)
    return 2


class _Version(argparse.Action):
    """``shoal --version``: the installed distribution's version, read only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=str(kwargs.get("help")))

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        import importlib.metadata

        try:
            version = importlib.metadata.version("shoal")
        except importlib.metadata.PackageNotFoundError:
            version = "0+unknown (not installed)"
        print(f"shoal {version}")
        parser.exit()


LOG_ROTATE_BYTES = 10 * 1024 * 1024
"""A log file (``--log-file``) larger than this at start is moved to ``FILE.1`` (the one before is dropped)."""


def configure_logging(level: int, log_file: Path | None = None) -> None:
    """One log line per event on stderr (or ``log_file``), the ML libraries kept quiet."""
    stream = sys.stderr
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        if log_file.exists() and log_file.stat().st_size > LOG_ROTATE_BYTES:
            log_file.replace(log_file.with_name(log_file.name + ".1"))
        stream = open(log_file, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (the process's log, open until exit)
        # pythonw (the Windows service) has no stdout or stderr: prints and tracebacks go to the log as well
        sys.stdout = sys.stdout or stream
        sys.stderr = sys.stderr or stream
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=stream)
    quiet_libraries()


def run_reporting_errors(prog: str, job: Callable[[], int]) -> int:
    """Run ``job``; a :class:`ShoalError` ends in one line ``PROG: error: ...`` and status 1, Ctrl-C in 130."""
    try:
        return job()
    except ShoalError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def quiet_libraries() -> None:
    """Keep the ML libraries' warnings and progress chatter off the terminal."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # nncf sets its logger's level when imported: the export hands that logger to ours (shards/export/convert.py)
    for name in ("transformers", "optimum", "torch"):
        logging.getLogger(name).setLevel(logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore")


if __name__ == "__main__":
    sys.exit(main())
