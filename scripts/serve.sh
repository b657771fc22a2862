#!/usr/bin/env bash
# Builds fastlimit if its sources changed (into .venv-serve, which holds
# only what the server needs) and starts it on its defaults (127.0.0.1:6380).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh --serve
exec .venv-serve/bin/fastlimit-server "$@"
