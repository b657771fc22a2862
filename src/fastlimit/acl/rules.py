"""ACL SETUSER's rules and the user they make (Redis 7.0's ACLSetUser,
with its error texts): a user's flags, passwords, key and channel patterns
and commands, and the permission byte per command id (``User.grant``)
that the connection reads in C.  The command table is the one source of
categories: ``Commands`` gives each Command its ``acl_id``.  No asyncio,
no server: the Acl subsystem (users.py) holds the users, the aclfile
(aclfile.py) writes and reads them as these rules.
"""

from __future__ import annotations

import hashlib
import hmac

from fastlimit._load import PRIORITIES, priority_value
from fastlimit._protocol import Command

# Redis 7.0's ACL CAT, in its order, and fastlimit's own (as a Redis 8
# module adds "bloom" or "json").
CATEGORIES = ("keyspace", "read", "write", "set", "sortedset", "list", "hash", "string",
              "bitmap", "hyperloglog", "geo", "stream", "pubsub", "admin", "fast", "slow",
              "blocking", "dangerous", "connection", "transaction", "scripting", "ratelimit")

# Redis's ACLSetUserStringError texts, by the errno it sets.
UNKNOWN = "Unknown command or category name in ACL"
SYNTAX = "Syntax error"
KEY_AFTER_STAR = ("Adding a pattern after the * pattern (or the 'allkeys' flag) is not valid "
                  "and does not have any effect. Try 'resetkeys' to start with an empty list "
                  "of patterns")
CHANNEL_AFTER_STAR = ("Adding a pattern after the * pattern (or the 'allchannels' flag) is not "
                      "valid and does not have any effect. Try 'resetchannels' to start with an "
                      "empty list of channels")
NO_SUCH_PASSWORD = "The password you are trying to remove from the user does not exist"
BAD_HASH = ("The password hash must be exactly 64 characters and contain only lowercase "
            "hexadecimal characters")
SUBCOMMAND_FIRST_ARG = "Allowing first-arg of a subcommand is not supported"


# The commands whose arguments name channels ACL rules restrict, and
# whether they are patterns (compared literally, as Redis does).
CHANNEL_COMMANDS = {"subscribe": False, "psubscribe": True, "publish": False}


class RuleError(ValueError):
    """A rule ACL SETUSER does not take; str() is Redis's text for it."""


def hash_password(password: bytes) -> str:
    return hashlib.sha256(password).hexdigest()


def split_patterns(patterns: list[bytes]) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """(prefixes, globs) as the connection checks keys (_protocol's
    key_admitted): ``tenant-a:*`` is the prefix ``tenant-a:``, compared
    without the glob matcher; a pattern with any other special is a glob."""
    prefixes, globs = [], []
    for p in patterns:
        body = p[:-1]
        if p.endswith(b"*") and not any(c in body for c in b"*?[\\"):
            prefixes.append(body)
        else:
            globs.append(p)
    return tuple(prefixes), tuple(globs)


def _valid_hash(text: bytes) -> bool:
    return len(text) == 64 and all(c in b"0123456789abcdef" for c in text)


def _hash_of(op: bytes, plain: bytes) -> str:
    """The SHA-256 hex a password rule names: >pw / <pw (plain is the
    sign) give the password, #hash / !hash the hash itself."""
    if op[:1] == plain:
        return hash_password(op[1:])
    if _valid_hash(op[1:]):
        return op[1:].decode()
    raise RuleError(BAD_HASH)


def has_spaces(text: bytes) -> bool:
    """Redis's ACLStringHasSpaces: whitespace or NUL."""
    return any(c in b" \t\n\r\x0b\x0c\x00" for c in text)


class Commands:
    """What rules resolve against: every Command and subcommand of the
    table by its full name, numbered, and the ids of each category."""

    def __init__(self, table: dict[bytes, Command]):
        self.by_name: dict[str, Command] = {}
        self.children: dict[int, list[int]] = {}
        self.categories: dict[str, list[Command]] = {c: [] for c in CATEGORIES}
        for cmd in table.values():
            self._number(cmd)
            for sub in cmd.subcommands.values():
                self._number(sub)
            self.children[cmd.acl_id] = [s.acl_id for s in cmd.subcommands.values()]
        self.size = len(self.by_name) + 1       # id 0 is never granted but by +@all

    def _number(self, cmd: Command) -> None:
        cmd.acl_id = len(self.by_name) + 1
        cmd.has_channels = cmd.name in CHANNEL_COMMANDS
        self.by_name[cmd.name] = cmd
        for category in cmd.acl_categories:
            self.categories.setdefault(category.lstrip("@"), []).append(cmd)

    def ids(self, cmd: Command) -> list[int]:
        """A command's id and, for a container, its subcommands' (+config
        allows CONFIG GET and CONFIG SET alike)."""
        return [cmd.acl_id, *self.children.get(cmd.acl_id, ())]


class User:
    """One ACL user, as Redis's struct user with its root selector."""

    def __init__(self, name: str, size: int):
        self.name = name
        self.enabled = False
        self.nopass = False
        # RESTORE's payload checks (there is no RESTORE here): kept to be
        # shown as Redis shows them, "sanitize-payload" after a reset.
        self.sanitize: str | None = None
        self.passwords: list[str] = []     # SHA-256 hex, in the order added
        self.allkeys = False
        self.patterns: list[bytes] = []
        self.allchannels = False
        self.channels: list[bytes] = []
        self.allowed = bytearray(size)
        self.command_rules: list[str] = ["-@all"]
        # fastlimit's own rule "priority:<name>": its checks' priority when
        # they name none, and the highest they may name (None: normal, and
        # any); an index of fastlimit._load.PRIORITIES.
        self.priority: int | None = None
        self.grant: tuple[bytes, tuple | None, tuple | None] | None = (
            bytes(size), ((), ()), ())

    def copy(self) -> User:
        other = User(self.name, len(self.allowed))
        other.__dict__.update({k: (list(v) if isinstance(v, list) else v)
                               for k, v in self.__dict__.items()})
        other.allowed = bytearray(self.allowed)
        return other

    def update_grant(self) -> None:
        """The map the connection checks: None when nothing is denied."""
        if self.allkeys and self.allchannels and all(self.allowed):
            self.grant = None
        else:
            self.grant = (bytes(self.allowed), None if self.allkeys else split_patterns(
                self.patterns), None if self.allchannels else tuple(self.channels))

    def check_password(self, password: bytes) -> bool:
        if not self.enabled:
            return False
        if self.nopass:
            return True
        hashed = hash_password(password)
        return any(hmac.compare_digest(hashed, p) for p in self.passwords)

    # ---- what Redis shows ----------------------------------------------------------

    def flags(self) -> list[str]:
        return ["on" if self.enabled else "off"] + ["nopass"] * self.nopass + (
            [self.sanitize] if self.sanitize else [])

    def keys_text(self) -> str:
        if self.allkeys:
            return "~*"
        return " ".join("~" + p.decode("utf-8", "surrogateescape") for p in self.patterns)

    def channels_text(self) -> str:
        if self.allchannels:
            return "&*"
        return " ".join("&" + c.decode("utf-8", "surrogateescape") for c in self.channels)

    def commands_text(self) -> str:
        return " ".join(self.command_rules)

    def describe(self) -> str:
        """ACLDescribeUser: the rules that make this user again."""
        parts = self.flags() + ["#" + p for p in self.passwords]
        if self.allkeys:
            parts.append("~*")
        else:
            parts += ["~" + p.decode("utf-8", "surrogateescape") for p in self.patterns]
        if self.allchannels:
            parts.append("&*")
        else:
            parts.append("resetchannels")
            parts += ["&" + c.decode("utf-8", "surrogateescape") for c in self.channels]
        parts.append(self.commands_text())
        if self.priority is not None:
            parts.append("priority:" + PRIORITIES[self.priority])
        return " ".join(parts)

    # ---- the rules -------------------------------------------------------------------

    def apply(self, op: bytes, commands: Commands) -> None:
        """One ACL SETUSER rule, as Redis's ACLSetUser; RuleError if not taken."""
        word = op.lower()
        if not op:
            return
        if word == b"on":
            self.enabled = True
        elif word == b"off":
            self.enabled = False
        elif word in (b"skip-sanitize-payload", b"sanitize-payload"):
            self.sanitize = word.decode()
        elif word == b"nopass":
            self.nopass, self.passwords = True, []
        elif word == b"resetpass":
            self.nopass, self.passwords = False, []
        elif op[:1] in (b">", b"#"):
            self._add_password(op)
        elif op[:1] in (b"<", b"!"):
            self._remove_password(op)
        elif word.startswith(b"priority:"):
            self.priority = priority_value(word[9:])
            if self.priority is None:
                raise RuleError(SYNTAX)
        elif word == b"resetpriority":
            self.priority = None
        elif word == b"reset":
            for rule in (b"resetpass", b"resetkeys", b"resetchannels", b"off",
                         b"sanitize-payload", b"-@all", b"resetpriority"):
                self.apply(rule, commands)
        elif op[:1] == b"(" or word == b"clearselectors":
            raise RuleError(SYNTAX)     # selectors (7.0) are not supported
        else:
            self._apply_selector_rule(op, word, commands)

    def _add_password(self, op: bytes) -> None:
        hashed = _hash_of(op, b">")
        if hashed not in self.passwords:
            self.passwords.append(hashed)
        self.nopass = False

    def _remove_password(self, op: bytes) -> None:
        hashed = _hash_of(op, b"<")
        if hashed not in self.passwords:
            raise RuleError(NO_SUCH_PASSWORD)
        self.passwords.remove(hashed)

    def _apply_selector_rule(self, op: bytes, word: bytes, commands: Commands) -> None:
        if word in (b"allkeys", b"~*"):
            self.allkeys, self.patterns = True, []
        elif word == b"resetkeys":
            self.allkeys, self.patterns = False, []
        elif word in (b"allchannels", b"&*"):
            self.allchannels, self.channels = True, []
        elif word == b"resetchannels":
            self.allchannels, self.channels = False, []
        elif word in (b"allcommands", b"+@all"):
            self.allowed[:] = b"\x01" * len(self.allowed)
            self.command_rules = ["+@all"]
        elif word in (b"nocommands", b"-@all"):
            self.allowed[:] = bytes(len(self.allowed))
            self.command_rules = ["-@all"]
        elif op[:1] == b"~":
            self._add_pattern(op[1:])
        elif op[:1] == b"%":
            raise RuleError(SYNTAX)     # read/write-only key patterns are not supported
        elif op[:1] == b"&":
            if self.allchannels:
                raise RuleError(CHANNEL_AFTER_STAR)
            if has_spaces(op[1:]):
                raise RuleError(SYNTAX)
            if op[1:] not in self.channels:
                self.channels.append(op[1:])
        elif op[:2] in (b"+@", b"-@"):
            self._set_category(word[2:].decode("utf-8", "replace"), op[:1] == b"+", commands)
        elif op[:1] in (b"+", b"-"):
            self._set_command(word[1:].decode("utf-8", "replace"), op[:1] == b"+", commands)
        else:
            raise RuleError(SYNTAX)

    def _add_pattern(self, pattern: bytes) -> None:
        if self.allkeys:
            raise RuleError(KEY_AFTER_STAR)
        if has_spaces(pattern):
            raise RuleError(SYNTAX)
        if pattern not in self.patterns:
            self.patterns.append(pattern)

    def _set_category(self, name: str, allow: bool, commands: Commands) -> None:
        members = commands.categories.get(name)
        if members is None or name == "all":
            raise RuleError(UNKNOWN)
        for cmd in members:
            self.allowed[cmd.acl_id] = allow
        self.command_rules.append(("+@" if allow else "-@") + name)

    def _set_command(self, name: str, allow: bool, commands: Commands) -> None:
        cmd = commands.by_name.get(name)
        if cmd is None and allow and "|" in name:
            parent_name, _, sub = name.rpartition("|")
            parent = commands.by_name.get(parent_name)
            if parent is None:
                raise RuleError(UNKNOWN)
            if "|" in parent.name:
                raise RuleError(SUBCOMMAND_FIRST_ARG)
            if not sub:
                raise RuleError(SYNTAX)
            if parent.subcommands:
                raise RuleError(UNKNOWN)
            raise RuleError(SYNTAX)    # Redis's deprecated first-arg rules are not supported
        if cmd is None:
            raise RuleError(UNKNOWN)
        for acl_id in commands.ids(cmd):
            self.allowed[acl_id] = allow
        self.command_rules.append(("+" if allow else "-") + name)
