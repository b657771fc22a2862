"""The README's HTTP examples, run as written (curl and redis-cli) against
a server on the manual clock, output compared line by line."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "README.md"


def http_examples(heading: str = "## HTTP front") -> list[tuple[str, str]]:
    """(command, expected output) of the first console block of the
    README's section under `heading`."""
    text = README.read_text()
    section = text[text.index(heading):]
    block = re.search(r"```console\n(.*?)```", section, re.S).group(1)
    examples: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            examples.append((line[2:], []))
        else:
            examples[-1][1].append(line)
    return [(cmd, "\n".join(out)) for cmd, out in examples]


def test_the_readme_examples_answer_as_shown(hs):
    examples = http_examples()
    assert len(examples) >= 5 and any("curl" in cmd for cmd, _ in examples)
    run_examples(hs, examples)


def run_examples(hs, examples: list[tuple[str, str]]) -> None:
    """Runs each command against hs's ports, comparing its output."""
    for cmd, expected in examples:
        cmd = cmd.replace("localhost:8380", f"127.0.0.1:{hs.http_port}").replace(
            "-p 6380", f"-p {hs.port}")
        done = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
        assert done.stdout.replace("\r\n", "\n").rstrip("\n") == expected, cmd
