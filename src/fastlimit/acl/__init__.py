"""ACL users and the one authorization gate's rules (Redis's acl.c).

- users: the users, their rules, the ACL file and ACL LOG (the Acl
  subsystem); every front asks it, never a copy of a setting;
- commands: the ACL command's handlers.

Compiled part it uses: _protocol.pyx's acl_check (the decision each
front's connection makes for every command)."""
