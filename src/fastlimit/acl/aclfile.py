"""The aclfile (Redis's ACL file): one line per user, "user <name>"
then the ACL SETUSER rules that make it, read by ACL LOAD (and at the
start), written by ACL SAVE.  No asyncio, no server: the Acl subsystem
(users.py) puts the users read in force."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from fastlimit.acl.rules import UNKNOWN, Commands, RuleError, User

NO_ACLFILE = ("ERR This Redis instance is not configured to use an ACL file. You may want to "
              "specify users via the ACL SETUSER command and then issue a CONFIG REWRITE "
              "(assuming you have a Redis configuration file set) in order to store users in "
              "the Redis configuration.")
LOAD_WARNING = ("WARNING: ACL errors detected, no change to the previously active ACL rules "
                "was performed")


def parse_aclfile(path: str, new_user: Callable[[str], User],
                  commands: Commands) -> dict[str, User]:
    """The users an aclfile makes (new_user: a user with no rules yet);
    ValueError with Redis's ACL LOAD text."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"Error loading ACLs, opening file '{path}': {e.strerror}") \
            from None
    users: dict[str, User] = {}
    errors: list[str] = []
    for number, line in enumerate(data.split(b"\n"), 1):
        words = line.strip(b" \t\r").split()
        if not words:
            continue
        if words[0] != b"user" or len(words) < 2:
            errors.append(f"{path}:{number} should start with user keyword followed by "
                          f"the username. ")
            continue
        name = words[1].decode("utf-8", "surrogateescape")
        if name in users:
            errors.append(f"WARNING: Duplicate user '{name}' found on line {number}. ")
            continue
        user = new_user(name)
        syntax_error = False
        for rule in words[2:]:
            try:
                user.apply(rule, commands)
            except RuleError as e:
                # As Redis: an unknown name is shown (it holds no secret),
                # other errors only the first in the file, without the rule.
                if str(e) == UNKNOWN:
                    errors.append(f"{path}:{number}: Error in applying operation "
                                  f"'{rule.decode('utf-8', 'surrogateescape')}': {e}. ")
                elif not syntax_error:
                    errors.append(f"{path}:{number}: {e}. ")
                    syntax_error = True
        user.update_grant()
        users[name] = user
    if errors:
        raise ValueError("".join(errors) + LOAD_WARNING)
    return users


def write_aclfile(path: str, users: list[User], log: logging.Logger) -> bool:
    """ACL SAVE: users as the rules that make them, in a temporary file
    renamed over path; False (logged) if that fails."""
    text = "".join(f"user {u.name} {u.describe()}\n" for u in users)
    tmp = f"{path}.tmp-{os.getpid()}-{int(time.time() * 1000)}"
    try:
        with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("Saving the ACL file %s: %s", path, e)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    return True
