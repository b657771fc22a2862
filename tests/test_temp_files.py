"""The suite writes its temporary files under pytest's basetemp, never
into the system's temp dir (conftest.py's _temp_dir_under_pytests): one
`make test` used to leave some 1,460 fastlimit-*.log files in /tmp."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_TEMP = re.compile(r"""["']/tmp\b|tempfile\.mktemp\(""")


def test_the_tests_and_the_servers_they_start_write_under_pytests_basetemp(
        tmp_path_factory, make_server):
    base = str(tmp_path_factory.getbasetemp())
    assert tempfile.gettempdir().startswith(base)
    srv = make_server()
    assert srv.log_path.startswith(base)
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip().startswith(base)


def test_no_test_or_benchmark_names_the_system_temp_dir():
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for top in ("tests", "bench", "scripts") for path in (ROOT / top).rglob("*")
             if path.suffix in (".py", ".sh") and "corpus" not in path.parts
             for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
             if SYSTEM_TEMP.search(line) and path != Path(__file__)]
    assert found == [], "write under tempfile.gettempdir() (pytest's basetemp) instead:\n" + \
        "\n".join(found)
    assert os.environ["TMPDIR"] == tempfile.gettempdir()
