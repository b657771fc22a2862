#!/usr/bin/env bash
# The example in one command: builds fastlimit into .venv (as `make serve`
# does), starts fastlimit-server on 127.0.0.1:6380 (or uses the one already
# running there), and serves examples/app.py on http://localhost:8000.
# Ctrl-C stops both. Then, in another terminal:
#
#   curl -i localhost:8000/hello     # repeat quickly: the 6th answer is a 429
#
# FASTLIMIT_PORT and APP_PORT change the ports.
set -euo pipefail
cd "$(dirname "$0")/.."

FASTLIMIT_PORT=${FASTLIMIT_PORT:-6380}
APP_PORT=${APP_PORT:-8000}
PY=.venv/bin/python

scripts/bootstrap.sh
# starlette and uvicorn come with the test extra; install them if this
# checkout's extra does not have them yet.
"$PY" -c "import starlette, uvicorn" 2>/dev/null || "$PY" -m pip install -q starlette uvicorn

fastlimit_up() {
    "$PY" -c "import redis, sys; redis.Redis(port=$FASTLIMIT_PORT, socket_timeout=1).ping()" \
        2>/dev/null
}

if fastlimit_up; then
    echo "== using the fastlimit already running on port $FASTLIMIT_PORT"
else
    echo "== starting fastlimit-server on port $FASTLIMIT_PORT"
    .venv/bin/fastlimit-server --port "$FASTLIMIT_PORT" &
    server_pid=$!
    trap 'kill "$server_pid" 2>/dev/null || true' EXIT
    for _ in $(seq 100); do fastlimit_up && break; sleep 0.1; done
    fastlimit_up || { echo "fastlimit-server did not start" >&2; exit 1; }
fi

echo "== example app on http://localhost:$APP_PORT — try: curl -i localhost:$APP_PORT/hello"
# --no-proxy-headers: the middleware handles X-Forwarded-For itself, and only
# from trusted proxies; uvicorn's own rewriting would trust 127.0.0.1.
FASTLIMIT_SERVERS=127.0.0.1:$FASTLIMIT_PORT "$PY" -m uvicorn --app-dir examples app:app \
    --host 127.0.0.1 --port "$APP_PORT" --no-proxy-headers
