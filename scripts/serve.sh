#!/usr/bin/env bash
# Builds everything and starts fastlimit on its defaults (127.0.0.1:6380).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/fastlimit-server "$@"
