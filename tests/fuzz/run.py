"""``make fuzz``: every target under atheris (coverage-guided, libFuzzer) for a share of a set time, then a report.

    python -m tests.fuzz.run [--seconds TOTAL] [--out DIR] [TARGET ...]

Each target runs in a process of its own (``--child``), with the modules that decode peers' bytes instrumented
(``agent``, ``discovery``, ``h11``), starting from its committed seed corpus (``tests/fuzz/corpus/<target>``, read
only) and adding what it finds to ``DIR/corpus/<target>``. libFuzzer stops a target at its first finding and saves
the input as ``DIR/findings/<target>-crash-*``: replay it with ``python -m tests.fuzz.run --replay FILE``, then make
it a plain test in ``tests/fuzz/test_findings.py`` and fix the code.

The report gives, per target, the executions, libFuzzer's coverage (edges and features of the instrumented code),
the corpus it ended with, and its findings; then the line coverage of ``agent/wire`` and of each decoder's module
when the final corpora are replayed under coverage.py.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
SEEDS = HERE / "corpus"
ROOT = HERE.parent.parent
MODULES = {
    "agent/wire": "agent/wire/*.py",
    "discovery/control.py": "discovery/control.py",
    "discovery/announcement.py": "discovery/announcement.py",
    "discovery/plan_codec.py": "discovery/plan_codec.py",
    "discovery/fleet_document.py": "discovery/fleet_document.py",
    "agent/fleet/signed.py": "agent/fleet/signed.py",
    "agent/chat/protocol.py": "agent/chat/protocol.py",
    "agent/chat/openai_request.py": "agent/chat/openai_request.py",
    "agent/transport/http.py": "agent/transport/http.py",
}
"""What the coverage replay reports on (the decoders the targets drive)."""


def child(target: str, argv: list[str]) -> None:
    """Fuzz one target in this process (libFuzzer's own flags in ``argv``)."""
    import atheris

    with atheris.instrument_imports(include=["agent", "discovery", "h11"]):
        from tests.fuzz.targets import TARGETS
    atheris.Setup([sys.argv[0], *argv], TARGETS[target])
    atheris.Fuzz()


def replay(paths: list[Path]) -> int:
    """Run every input under ``paths`` (files, or folders of them) through its target; 1 if any raised."""
    from tests.fuzz.targets import TARGETS

    failed = 0
    for path in paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            target = _target_of(file)
            try:
                TARGETS[target](file.read_bytes())
            except Exception as exc:
                failed += 1
                print(f"{file}: {target}: {type(exc).__name__}: {exc}"[:2000])
    return 1 if failed else 0


def _target_of(file: Path) -> str:
    from tests.fuzz.targets import TARGETS

    for part in (file.parent.name, file.name.split("-crash-")[0]):
        if part in TARGETS:
            return part
    raise SystemExit(f"{file}: name no target (its folder, or a '<target>-crash-...' name): {', '.join(TARGETS)}")


_STATUS = re.compile(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/(\S+)")
_STAT = re.compile(r"stat::(\w+):\s+(\d+)")


def fuzz(target: str, seconds: int, out: Path) -> dict[str, object]:
    """Fuzz ``target`` for ``seconds`` in a child process; its figures."""
    corpus, findings = out / "corpus" / target, out / "findings"
    corpus.mkdir(parents=True, exist_ok=True)
    findings.mkdir(parents=True, exist_ok=True)
    log = out / f"{target}.log"
    flags = [
        f"-max_total_time={seconds}",
        "-print_final_stats=1",
        "-timeout=10",
        "-rss_limit_mb=2048",
        f"-artifact_prefix={findings}/{target}-",
        str(corpus),
        str(SEEDS / target),
    ]
    started = time.monotonic()
    with log.open("w") as sink:
        code = subprocess.call(
            [sys.executable, "-m", "tests.fuzz.run", "--child", target, "--", *flags],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
    text = log.read_text(errors="replace")
    status = _STATUS.findall(text)
    stats = dict(_STAT.findall(text))
    last = status[-1] if status else ("0", "0", "0", "0", "0")
    crashes = sorted(p.name for p in findings.glob(f"{target}-*"))
    return {
        "target": target,
        "seconds": round(time.monotonic() - started),
        "executions": int(stats.get("number_of_executed_units", last[0])),
        "exec_per_s": int(stats.get("average_exec_per_sec", 0)),
        "cov": int(last[1]),
        "ft": int(last[2]),
        "corpus": f"{last[3]} inputs ({last[4]})",
        "new": int(stats.get("new_units_added", 0)),
        "findings": crashes,
        "exit": code,
    }


def line_coverage(out: Path) -> dict[str, float]:
    """Lines of each of ``MODULES`` run when the seeds and the corpora found are replayed, in percent."""
    import json

    data = out / "coverage.json"
    folders = [str(SEEDS), *(str(p) for p in (out / "corpus").iterdir())]
    run = [sys.executable, "-m", "coverage", "run", f"--data-file={out / '.coverage'}", "--source=agent,discovery"]
    subprocess.run([*run, "-m", "tests.fuzz.run", "--replay", *folders], cwd=ROOT, check=False)
    subprocess.run(
        [sys.executable, "-m", "coverage", "json", f"--data-file={out / '.coverage'}", "-o", str(data), "-q"],
        cwd=ROOT,
        check=True,
    )
    files = json.loads(data.read_text())["files"]
    report = {}
    for name, pattern in MODULES.items():
        matched = [f for path, f in files.items() if Path(path).match(pattern)]
        covered = sum(f["summary"]["covered_lines"] for f in matched)
        total = sum(f["summary"]["num_statements"] for f in matched)
        report[name] = round(100 * covered / total, 1) if total else 0.0
    return report


def main() -> int:
    from tests.fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help=f"of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--seconds", type=int, default=int(os.environ.get("FUZZ_SECONDS", "600")), help="in all")
    parser.add_argument("--out", type=Path, default=ROOT / ".fuzz", help="corpora found, findings, logs")
    parser.add_argument("--replay", nargs="+", type=Path, metavar="PATH", help="run these inputs; fuzz nothing")
    args = parser.parse_args()
    if args.replay:
        return replay(args.replay)
    targets = args.targets or list(TARGETS)
    unknown = set(targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown targets {sorted(unknown)}: choose from {', '.join(TARGETS)}")
    share = max(1, args.seconds // len(targets))
    print(f"fuzzing {len(targets)} targets for {share} s each; logs, corpora and findings in {args.out}")
    rows = []
    for target in targets:
        row = fuzz(target, share, args.out)
        rows.append(row)
        found = ", ".join(row["findings"]) or "none"  # type: ignore[arg-type]
        print(
            f"{target:15} {row['executions']:>10,} executions ({row['exec_per_s']}/s)  cov {row['cov']} "
            f"ft {row['ft']}  corpus {row['corpus']}  findings: {found}"
        )
    print("line coverage when the seeds and the corpora found are replayed:")
    for name, percent in line_coverage(args.out).items():
        print(f"  {name:32} {percent:5.1f} %")
    return 1 if any(row["findings"] for row in rows) else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[4:] if sys.argv[3:4] == ["--"] else sys.argv[3:])
    else:
        sys.exit(main())
