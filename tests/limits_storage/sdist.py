"""The `limits` source distribution whose tests test_limits_suite.py runs:
the version installed (pinned in pyproject's test extra), fetched with
``pip download`` into build/limits-sdist/ (gitignored) by
scripts/bootstrap.sh, or here on first use, and extracted beside it."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "build" / "limits-sdist"


def limits_source() -> Path:
    """The extracted sdist of the installed limits (fetched if missing)."""
    v = version("limits")
    tree = CACHE / f"limits-{v}"
    if (tree / "tests" / "test_strategy.py").exists():
        return tree
    CACHE.mkdir(parents=True, exist_ok=True)
    archive = CACHE / f"limits-{v}.tar.gz"
    if not archive.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", "--disable-pip-version-check", "-q", "-d", str(CACHE),
                        f"limits=={v}"], check=True, timeout=300)
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE, filter="data")
    return tree


if __name__ == "__main__":
    print(limits_source())
