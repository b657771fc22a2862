"""ACL rules (acl/users.py), as ACL SETUSER and an aclfile line give
them: words applied in order to a new user.  RuleError is the one clear
error.  A user the rules make must be made again, the same, by the rules
ACL LIST and ACL SAVE write for it (describe()), and its grant must be
one the C check (acl_check) reads."""

import sys

import harness

with harness.instrumented():
    from fastlimit._protocol import acl_check
    from fastlimit.acl.users import Commands, RuleError, User
    from fastlimit.server.commands.table import build_table

TABLE = build_table()
COMMANDS = Commands(TABLE)
PROBES = [[b"cl.check", b"tenant-a:1", b"5", b"1"], [b"config", b"set", b"hz", b"10"],
          [b"ping"]]


def made_by(rules: list[bytes]) -> User:
    user = User("fuzz", COMMANDS.size)
    for rule in rules:
        user.apply(rule, COMMANDS)
    user.update_grant()
    return user


def one_input(data: bytes) -> None:
    with harness.expect(RuleError):
        user = made_by(data.split())
        described = user.describe()
        again = made_by(described.encode("utf-8", "surrogateescape").split())
        if again.describe() != described or again.grant != user.grant:
            raise harness.Finding(f"{described!r} does not make the same user again")
        for args in PROBES:
            cmd = TABLE[args[0]]
            if args[0] == b"config":
                cmd = cmd.subcommands[b"set"]
            acl_check(user.grant, cmd, args)


if __name__ == "__main__":
    harness.main(one_input)
    sys.exit(0)
