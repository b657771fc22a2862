"""Hot keys (issue 26, "see them"): every node keeps a bounded estimate of
the keys checked most often and shows them with their checks per second.

- report: the tracker's counters as entries (the key, or a rule's bucket
  by rule id, client and resource; estimated checks per second and their
  lower bound), rendered for INFO and /metrics (no asyncio);
- subsystem: HotKeysSubsystem, the settings (hotkeys-top-k, hotkeys-sample),
  continuous tracking and HOTKEYS sessions, INFO hotkeys and the counts in
  INFO stats and memory;
- commands: HOTKEYS START, STOP, GET, RESET (Redis 8.6's syntax, the OPS
  metric; CPU and NET are refused).

Kernel parts it uses: fl_hotkeys.h (Space-Saving top-k in C, fixed memory)
and _hotkeys.pyx (HotKeys, its owner for Python); ServerCore.hotkeys is the
server's tracker, which check_bucket (_protocol_checks.pxi: CL.CHECK,
/v1/check/bucket) and RuleEngine.evaluate (_rules.pyx: CL.LIMIT, CL.APPLY,
the HTTP endpoints, the Envoy rate limit service) feed one check in
hotkeys-sample: where every front's checks are decided.  The HTTP front's
/metrics (server/http/metrics.py) and status page read report.py.
"""
