"""The README's examples, read as the tests run them."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_console(heading: str, nth: int = 0) -> list[tuple[list[str], list[str]]]:
    """The nth ```console block under heading: (the words of each `$`
    line, comments cut; the lines it shows after it, comments after a
    space cut)."""
    text = README.read_text()
    blocks = re.findall(r"```console\n(.*?)```", text[text.index(heading):], re.DOTALL)
    assert len(blocks) > nth, heading
    block = blocks[nth]
    steps: list[tuple[list[str], list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((shlex.split(line[2:], comments=True), []))
        else:
            steps[-1][1].append(re.sub(r"\s+#.*", "", line))    # "# Server" is output
    return steps


def run_redis_cli(words: list[str], port: int) -> str:
    """A README line `redis-cli -p 6380 ...` run against the server on
    port, as redis-cli prints to a pipe; with the lines the README shows
    (as redis-cli prints to a terminal) to compare with, in shown_lines."""
    assert words[:3] == ["redis-cli", "-p", "6380"], words
    return subprocess.run(["redis-cli", "-p", str(port), *words[3:]], capture_output=True,
                          text=True, timeout=10, check=True).stdout


def shown_lines(shown: list[str]) -> list[str]:
    """What the README shows, as redis-cli prints it to a pipe: the bare
    values, without "1) (integer) "."""
    return [re.sub(r"^\d+\) \(integer\) ", "", line) for line in shown]


def readme_python(heading: str) -> list[str]:
    """The ```python blocks of the section under heading (up to the next
    heading of its level or above), in order."""
    text = README.read_text()
    start = text.index(heading)
    level = heading.split(" ", 1)[0]
    body = start + len(heading)
    ends = [m.start() for m in re.finditer(rf"^#{{1,{len(level)}}} ", text[body:],
                                           re.MULTILINE)]
    section = text[start:body + ends[0]] if ends else text[start:]
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def shown_prints(block: str) -> list[str]:
    """What a python block says its print() lines print: the comment after
    each."""
    return [line.split("#", 1)[1].strip() for line in block.splitlines()
            if line.startswith("print(") and "#" in line]
