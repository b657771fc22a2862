"""The RESP front, the server's own protocol (Redis's networking.c).

- listener: the RESP listeners on every bind address and, with tls-port,
  their TLS twins: bound before the subsystems start, serving once they
  are up, moved by CONFIG SET bind and port (the new sockets bound before
  anything changes, the old listeners closed once the change holds).

Compiled parts it uses: _protocol.pyx (Connection: a client's connection,
dispatch, the fast paths) and its .pxi files (_protocol_checks.pxi:
CL.CHECK, CL.LIMIT and PING in C; _protocol_acl.pxi: the ACL verdict;
_protocol_multi.pxi: MULTI/EXEC and WATCH; _protocol_observe.pxi: MONITOR
and the watchers; _protocol_slots.pxi: cluster routing; _protocol_glob.pxi:
Redis's glob), and _resp.pyx (RESP parsing and replies)."""
