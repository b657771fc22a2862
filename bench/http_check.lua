-- wrk script for bench/http_front.py: keep-alive POSTs of one rate-limit check each,
-- {"client_key": "key:%012d", "resource": <resource>, "cost": <cost>}, with
-- the client key drawn at random from a fixed set for every request (the key
-- format is redis-benchmark's key:__rand_int__, so the RESP rows spend the
-- same buckets).
--
--   wrk -t 1 -c 50 -d 10s -s bench/http_check.lua http://127.0.0.1:PORT/v1/check \
--       -- <keys> <resource> [cost]
--
-- The requests are formatted once, in init, so the client spends its time
-- sending rather than building strings.  done() prints one line,
-- "WRK_JSON {...}", with the counts and latency percentiles (µs) that
-- bench/http_front.py reads.

local requests = {}
local count = 0

local function json_string(s)
  return '"' .. s:gsub('[%c"\\]', function(c)
    return string.format("\\u%04x", c:byte())
  end) .. '"'
end

function init(args)
  local keys = tonumber(args[1] or "10000")
  local resource = args[2] or "GET /api/items"
  local cost = tonumber(args[3] or "1")
  local headers = {["Content-Type"] = "application/json"}
  count = keys
  for i = 0, keys - 1 do
    local body = string.format('{"client_key": "key:%012d", "resource": %s, "cost": %d}',
                               i, json_string(resource), cost)
    requests[i + 1] = wrk.format("POST", nil, headers, body)
  end
  math.randomseed(os.time())
end

function request()
  return requests[math.random(count)]
end

function done(summary, latency, _)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "bytes": %d, ' ..
    '"errors": {"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}, ' ..
    '"latency_us": {"mean": %.1f, "max": %d, "p50": %d, "p90": %d, "p99": %d, "p999": %d}}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    latency.mean, latency.max, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9)))
end
