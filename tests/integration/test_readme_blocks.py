"""The README's blocks for a ring by hand, as a user pastes them in order (issue 22 §5): the ring of three
agents and ``shoal generate`` through it, then the chat agent in front of the same stages with ``shoal ask``,
then the ``curl`` call of its OpenAI-style API with the URL and token read from ``chat.json``.

The blocks are read from README.md itself, so a block that stops working (ports that clash, a variable
never set, a flag renamed) fails here. They run in one bash script with ``set -e``, in a home folder of the
test's own (``~/.local/share/shoal``) and the session's export in place of ``exports/smollm2-3stage``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

README = Path(__file__).parents[2] / "README.md"
BLOCKS = ("shoal fleet init && for n in s0 s1 s2 me", "shoal fleet issue chat", "F=~/.local/share/shoal/chat.json")
"""The first line of each block that runs, in the README's order."""


def readme_block(first_line: str) -> str:
    """The ``sh`` block of README.md whose first line starts with ``first_line`` (indented blocks too)."""
    for match in re.finditer(r"^( *)```sh\n(.*?)^\1```", README.read_text(encoding="utf-8"), re.S | re.M):
        indent, body = match.group(1), match.group(2)
        lines = [line[len(indent) :] for line in body.splitlines()]
        if lines and lines[0].startswith(first_line):
            return "\n".join(lines) + "\n"
    raise AssertionError(f"README.md has no sh block starting {first_line!r}")


def test_the_readme_blocks_for_a_ring_by_hand_run_in_order(
    exported: Callable[..., Path], cache_dir: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "smollm2-3stage").symlink_to(exported(3, "int4"))
    script = "set -euo pipefail\n" + "".join(readme_block(first) for first in BLOCKS)
    (tmp_path / "blocks.sh").write_text(script, encoding="utf-8")
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "HOME": str(home),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SHOAL_CACHE_DIR": str(cache_dir),
    }
    env.pop("SHOAL_DATA_DIR", None)
    env.pop("XDG_DATA_HOME", None)
    # files, not pipes: the agents started in the background hold their copies open until they stop
    with (tmp_path / "out.txt").open("w") as stdout, (tmp_path / "err.txt").open("w") as stderr:
        process = subprocess.Popen(
            ["bash", str(tmp_path / "blocks.sh")],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # the blocks' background agents: one process group to stop
        )
        try:
            process.wait(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert process.returncode == 0, f"the README's blocks failed:\n{err[-3000:]}"
    # shoal generate's summary, then shoal ask's (the conversation that follows reads an empty stdin)
    summaries = re.findall(r"^\[(\d+) tokens in .*$", err, re.M)
    assert len(summaries) == 2 and all(int(n) > 0 for n in summaries), err[-3000:]
    assert "through a ring of 3 agents" in err
    completion = json.loads(out.strip().splitlines()[-1])
    assert completion["object"] == "chat.completion", completion
    assert completion["choices"][0]["finish_reason"] in ("stop", "length")
    assert "." not in completion["choices"][0]["message"]["content"]  # "stop": ["."] honoured
