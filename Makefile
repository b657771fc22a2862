.PHONY: serve test test-debug-serial bench soak keyflood fuzz ha cluster cluster-stop build clean redis-tcl-suite

serve:          ## build if the sources changed, start the server on 127.0.0.1:6380
	scripts/serve.sh

test:           ## build everything (release and debug), ruff and mypy on src/, run the whole test suite
	scripts/test.sh

test-debug-serial:  ## the serial tests (volume, time bounds) on the debug build, which make test runs on the release build only
	scripts/bootstrap.sh --debug
	FASTLIMIT_PYTHON=$$PWD/.venv-debug/bin/python .venv-debug/bin/python -m pytest -m "serial and not release_only"

bench:          ## fastlimit vs redis-server, the clients vs the limits library, replication, the PostgreSQL rules-store (bench/README.md)
	scripts/bootstrap.sh
	.venv/bin/python bench/run.py
	.venv/bin/python bench/clients.py
	.venv/bin/python bench/replication.py
	.venv/bin/python bench/failover.py
	.venv/bin/python bench/cluster.py
	.venv/bin/python bench/http_front.py
	.venv/bin/python bench/grpc_front.py
	.venv/bin/python bench/envoy_e2e.py
	.venv/bin/python bench/acl.py
	.venv/bin/python bench/rules_store.py
	.venv/bin/python bench/overload.py
	.venv/bin/python bench/hotkey_split.py
	.venv/bin/python bench/regions.py
	.venv/bin/python bench/takeover.py

soak:           ## every attack of the hardening review at once, a good client's latency and memory (bench/soak.py)
	scripts/bootstrap.sh
	.venv/bin/python bench/soak.py

keyflood:       ## tens of millions of new keys against maxmemory 200mb and against no bound: memory, throughput, a real client (bench/keyflood.py, ~3 min)
	scripts/bootstrap.sh
	.venv/bin/python bench/keyflood.py

fuzz:           ## every fuzz target of tests/fuzz/ on the sanitized build, FUZZ_SECONDS each (default 300): executions, exec/s, coverage (bench/README.md)
	scripts/fuzz.sh

ha:             ## a local HA set: primary, two standbys, three redis-sentinels on 127.0.0.1 (scripts/ha.py)
	scripts/bootstrap.sh
	.venv/bin/python scripts/ha.py

cluster:        ## a local cluster: 3 shards of primary + standby, 3 redis-sentinels, on 127.0.0.1:7000-7008 (scripts/cluster.py)
	scripts/bootstrap.sh
	.venv/bin/python scripts/cluster.py start

cluster-stop:   ## stops what make cluster started
	.venv/bin/python scripts/cluster.py stop

# Redis's sources are not part of this repository: REDIS_SRC is a redis/redis
# checkout (tag 7.0.15 is used) or a directory holding its tests/; by default
# build/redis, which scripts/redis_tcl_suite.sh says how to fill when missing.
REDIS_SRC ?= build/redis
redis-tcl-suite:  ## Redis 7.0.15's own Tcl units (protocol, info-command, introspection, multi, auth, pubsub) against a fresh fastlimit; REDIS_SRC= a redis/redis checkout or tests dir (default build/redis)
	scripts/bootstrap.sh
	FASTLIMIT_PYTHON=$$PWD/.venv/bin/python scripts/redis_tcl_suite.sh $(REDIS_SRC)

build:          ## in-place build for development (python3 -m pytest from src/)
	python3 setup.py build_ext --inplace

clean:
	rm -rf build .venv .venv-debug .venv-fuzz .venv-serve src/fastlimit/*.so src/fastlimit/*.c src/*.egg-info
