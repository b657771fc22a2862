"""ACL users and the one authorization gate's rules (Redis's acl.c).

- rules: ACL SETUSER's rules, the user they make (its grant: a permission
  byte per command id, its key and channel patterns) and the commands'
  numbering (no asyncio, no server);
- aclfile: the aclfile's format, read by ACL LOAD and written by ACL SAVE
  (no asyncio, no server);
- log: ACL LOG's entries, grouped and bounded as Redis's;
- users: the users (the Acl subsystem: the default user behind
  requirepass, repl-user, a change put in force on the user's
  connections, who may run what, ACL LOG, protected mode); every front
  asks it, never a copy of a setting;
- commands: the ACL command's handlers.

Compiled part it uses: _protocol.pyx's acl_check (the decision each
front's connection makes for every command)."""
