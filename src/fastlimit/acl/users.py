"""Redis-style ACL users: the rule syntax of ACL SETUSER (Redis 7.0's
ACLSetUser, with its error texts), the users, the aclfile, ACL LOG, the
default user behind requirepass, and protected mode.

The command table (commands/table.py) is the one source of categories:
each Command gets a small integer ``acl_id`` here, and a user's
permissions are one byte per id (``User.grant``), which the connection
(_protocol.pyx, ``Connection.acl_denied``) reads in C with the user's key
patterns.  A user that may run everything on every key has no grant, so
its connections pay nothing for ACL.  Users live in Python because they
change only by command; a change hands every connection of the user its
new grant.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time

from fastlimit._protocol import Command, acl_check
from fastlimit.server.clients import client_line
from fastlimit.server.config import ConfigError
from fastlimit.server.subsystem import Subsystem

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

PROTECTED_MODE_TEXT = (
    b"-DENIED Redis is running in protected mode because protected mode is enabled and no "
    b"password is set for the default user. In this mode connections are only accepted from "
    b"the loopback interface. If you want to connect from external computers to Redis you may "
    b"adopt one of the following solutions: 1) Just disable protected mode sending the command "
    b"'CONFIG SET protected-mode no' from the loopback interface by connecting to Redis from "
    b"the same host the server is running, however MAKE SURE Redis is not publicly accessible "
    b"from internet if you do so. Use CONFIG REWRITE to make this change permanent. 2) "
    b"Alternatively you can just disable the protected mode by editing the Redis configuration "
    b"file, and setting the protected mode option to 'no', and then restarting the server. 3) "
    b"If you started the server manually just for testing, restart it with the "
    b"'--protected-mode no' option. 4) Setup a an authentication password for the default "
    b"user. NOTE: You only need to do one of the above things in order for the server to start "
    b"accepting connections from the outside.\r\n")

NO_ACLFILE = ("ERR This Redis instance is not configured to use an ACL file. You may want to "
              "specify users via the ACL SETUSER command and then issue a CONFIG REWRITE "
              "(assuming you have a Redis configuration file set) in order to store users in "
              "the Redis configuration.")
LOAD_WARNING = ("WARNING: ACL errors detected, no change to the previously active ACL rules "
                "was performed")
# Entries of ACL LOG with the same reason, context, object and user this
# close together are one entry with a count, as in Redis.
LOG_GROUPING_MS = 60_000
LOG_GROUPING_SCAN = 10


# repl-user's rules besides its password (repl-password): what a replica's
# link sends after its AUTH (CL.SYNC, then REPLCONF listening-port,
# ip-address and ACK), and nothing else: no key, no channel.
REPLICATION_RULES = (b"reset", b"on", b"+cl.sync", b"+replconf")


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


def _has_spaces(text: bytes) -> bool:
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
        elif word == b"reset":
            for rule in (b"resetpass", b"resetkeys", b"resetchannels", b"off",
                         b"sanitize-payload", b"-@all"):
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
            if _has_spaces(op[1:]):
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
        if _has_spaces(pattern):
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


class LogEntry:
    __slots__ = ("count", "reason", "context", "object", "username", "created_ms", "client_info")

    def __init__(self, reason, context, obj, username, client_info):
        self.count = 1
        self.reason, self.context, self.object = reason, context, obj
        self.username, self.client_info = username, client_info
        self.created_ms = time.time() * 1000

    def same_event(self, other: LogEntry) -> bool:
        return (self.reason, self.context, self.object, self.username) == \
            (other.reason, other.context, other.object, other.username) and \
            other.created_ms - self.created_ms <= LOG_GROUPING_MS


class Acl(Subsystem):
    """The users, ACL LOG and the settings around them (aclfile,
    acllog-max-len, requirepass, protected-mode)."""

    def __init__(self, app, log):
        self.app = app
        self.log = log
        self.commands = Commands(app.core.commands)
        self._subscribe = self.commands.by_name["subscribe"]
        self.users: dict[str, User] = {}
        self.entries: list[LogEntry] = []     # newest first
        self.denied = {"command": 0, "key": 0, "channel": 0, "auth": 0}
        self.version = 0        # moves on at each change of the users
        settings = app.settings
        self.aclfile: str | None = settings.aclfile
        self.log_max_len = settings.acllog_max_len
        self.protected_mode = settings.protected_mode
        self.users["default"] = self.open_default()
        # (repl-user, repl-password) while repl-password makes an ACL user
        self.replication: tuple[str, bytes] | None = None
        # With an aclfile, requirepass at start is ignored, as in Redis;
        # CONFIG SET requirepass later still sets the default user's password.
        self.requirepass = settings.requirepass
        if self.aclfile:
            error = self.load_file()
            if error is not None:
                raise ConfigError(error)
        elif settings.requirepass:
            self.set_default_password(settings.requirepass)
        self.make_replication_user(settings)
        self.users_changed()

    @property
    def default(self) -> User:
        return self.users["default"]

    def new_user(self, name: str) -> User:
        return User(name, self.commands.size)

    def open_default(self) -> User:
        """The default user with no aclfile saying otherwise: everything,
        no password."""
        default = self.new_user("default")
        for rule in (b"+@all", b"~*", b"&*", b"on", b"nopass"):
            default.apply(rule, self.commands)
        default.update_grant()
        return default

    # ---- settings ---------------------------------------------------------------------

    def apply_settings(self, s) -> None:
        self.log_max_len = s.acllog_max_len
        del self.entries[self.log_max_len:]
        self.protected_mode = s.protected_mode
        if s.requirepass != self.requirepass:
            self.requirepass = s.requirepass
            self.set_default_password(s.requirepass)
        self.make_replication_user(s)
        self.users_changed()

    def set_default_password(self, password: bytes | None) -> None:
        """Redis's ACLUpdateDefaultUserPassword: resetpass then >pw (its
        bytes, whatever they are, as Redis takes binary passwords), or nopass."""
        user = self.default
        user.apply(b"resetpass", self.commands)
        user.apply(b">" + password if password else b"nopass", self.commands)

    def make_replication_user(self, s) -> None:
        """repl-user/repl-password as the ACL user a replica AUTHs as (its
        masteruser/masterauth): REPLICATION_RULES and that password, made
        when repl-password is set, made again when either changes and after
        ACL LOAD, removed (its links closed) when repl-password is unset or
        the name changes.  ConfigError refuses a name no user can have."""
        wanted = (s.repl_user, s.repl_password) if s.repl_password else None
        if wanted == self.replication:
            return
        if wanted is not None and (wanted[0] == "default" or _has_spaces(
                wanted[0].encode("utf-8", "surrogateescape"))):
            raise ConfigError("argument must be an ACL user name other than default, "
                              "without spaces", "repl-user")
        old, self.replication = self.replication, wanted
        if old is not None and (wanted is None or wanted[0] != old[0]) and old[0] in self.users:
            self.deluser([old[0]])
        if wanted is not None:
            self.install(self.replication_user())

    def replication_user(self) -> User:
        assert self.replication is not None
        name, password = self.replication
        user = self.new_user(name)
        for rule in (*REPLICATION_RULES, b">" + password):
            user.apply(rule, self.commands)
        user.update_grant()
        return user

    def users_changed(self) -> None:
        """What the connection layer reads from the users: whether new
        connections need AUTH, protected mode's refusal, the fronts'
        cached credentials."""
        core = self.app.core
        default = self.default
        open_default = default.enabled and default.nopass
        core.default_user = default
        core.auth_required = not open_default
        core.protected_refusal = PROTECTED_MODE_TEXT if (
            self.protected_mode and default.nopass) else None
        self.version += 1

    # ---- users ------------------------------------------------------------------------

    def setuser(self, name: str, rules: list[bytes]) -> None:
        """ACL SETUSER, all or nothing; RuleError names the rule refused."""
        if _has_spaces(name.encode("utf-8", "surrogateescape")):
            raise RuleError("Usernames can't contain spaces or null characters")
        old = self.users.get(name)
        user = old.copy() if old is not None else self.new_user(name)
        for rule in rules:
            try:
                user.apply(rule, self.commands)
            except RuleError as e:
                raise RuleError(f"Error in ACL SETUSER modifier "
                                f"'{rule.decode('utf-8', 'surrogateescape')}': {e}") from None
        user.update_grant()
        self.install(user)

    def install(self, user: User) -> None:
        """Puts user in place of the one of its name, whose connections run
        as it from now on (a subscriber it no longer admits is closed)."""
        old = self.users.get(user.name)
        self.users[user.name] = user
        for conn in self.connections_of(old):
            if conn.subscribed and not self.may_keep_subscriptions(user, conn):
                self.disconnect(old, only=conn)
            else:
                conn.set_user(user, conn.authenticated)
        self.users_changed()

    def may_keep_subscriptions(self, user: User, conn) -> bool:
        """Redis's ACLKillPubsubClientsIfNeeded: a subscriber whose channels
        or patterns the user's new rules no longer admit is disconnected."""
        if user.allchannels:
            return True
        channels = (conn.pubsub_channels or {}).keys()
        patterns = (conn.pubsub_patterns or {}).keys()
        return not self.channel_position(tuple(user.channels), self._subscribe,
                                         [b"subscribe", *channels]) and \
            all(p in user.channels for p in patterns)

    def deluser(self, names: list[str]) -> int:
        if "default" in names:
            raise RuleError("The 'default' user cannot be removed")
        deleted = 0
        for name in names:
            user = self.users.pop(name, None)
            if user is not None:
                deleted += 1
                self.disconnect(user)
        self.users_changed()
        return deleted

    def connections_of(self, user: User | None) -> list:
        if user is None:
            return []
        return [c for c in self.app.core.clients.values() if c.user is user]

    def disconnect(self, user: User | None, only=None) -> None:
        """Closes the user's connections (or only that one) as Redis's
        ACLFreeUserAndKillClients: back to the default user,
        unauthenticated, closed after the reply of the command running
        (when it is one of them)."""
        for conn in self.connections_of(user) if only is None else [only]:
            conn.set_user(self.default, False)
            conn.close()

    def dry_run(self, user: User, args: list[bytes]) -> str | None:
        """ACL DRYRUN: None if user may run args, else Redis's sentence why."""
        from fastlimit._resp import ReplyError
        cmd = self.app.core.commands.get(args[0].lower())
        if cmd is not None and cmd.subcommands and len(args) >= 2:
            cmd = cmd.subcommands.get(args[1].lower())
        if cmd is None:
            raise ReplyError(f"ERR Command '{args[0].decode('utf-8', 'replace')}' not found")
        if not cmd.check_arity(len(args)):
            raise ReplyError(f"ERR wrong number of arguments for '{cmd.name}' command")
        return self.refusal(user, cmd, args)

    def channel_position(self, channels: tuple[bytes, ...], cmd: Command,
                         args: list[bytes]) -> int:
        """0 if the channel patterns admit every channel cmd names in args,
        else the position of the first they do not (Redis's
        ACLCheckChannelAgainstList: a channel is matched against the
        patterns, a PSUBSCRIBE pattern compared literally)."""
        from fastlimit._protocol import glob
        literal = CHANNEL_COMMANDS[cmd.name]
        names = args[1:2] if cmd.name == "publish" else args[1:]
        for pos, name in enumerate(names, 1):
            if not any(name == p if literal else glob(p, name) for p in channels):
                return pos
        return 0

    def refusal(self, user: User, cmd: Command, args: list[bytes]) -> str | None:
        """None if user may run cmd (a subcommand, for a container) with
        args, else ACL DRYRUN's sentence why."""
        pos = 0 if cmd.no_auth else acl_check(user.grant, cmd, args)
        if pos == 0 and cmd.has_channels and user.grant is not None and \
                user.grant[2] is not None:
            channel = self.channel_position(user.grant[2], cmd, args)
            if channel:
                return (f"This user has no permissions to access the "
                        f"'{args[channel].decode('utf-8', 'surrogateescape')}' channel")
        if pos < 0:
            return f"This user has no permissions to run the '{cmd.name}' command"
        if pos > 0:
            return (f"This user has no permissions to access the "
                    f"'{args[pos].decode('utf-8', 'surrogateescape')}' key")
        return None

    def authenticate(self, name: str, password: bytes) -> User | None:
        """The user AUTH <name> <password> runs as, from the users as they
        are now (every front asks this: a changed password, a user switched
        off or deleted counts at once), or None.  The password is bytes,
        any bytes; name is str, surrogateescape for bytes that are not UTF-8."""
        user = self.users.get(name)
        if user is None or not user.check_password(password):
            return None
        return user

    def password_hashes(self, name: str) -> tuple[User, list[bytes]] | None:
        """An enabled user and the SHA-256 digests of its passwords, what a
        challenge-response proof is keyed on (CL.PEERAUTH); None for a user
        that is missing, off or nopass, which proves nothing."""
        user = self.users.get(name)
        if user is None or not user.enabled or user.nopass or not user.passwords:
            return None
        return user, [bytes.fromhex(p) for p in user.passwords]

    # ---- the aclfile --------------------------------------------------------------------

    def parse_file(self, path: str) -> dict[str, User]:
        """The users an aclfile makes; ValueError with Redis's ACL LOAD text."""
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
            user = self.new_user(name)
            syntax_error = False
            for rule in words[2:]:
                try:
                    user.apply(rule, self.commands)
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

    def load_file(self) -> str | None:
        """ACL LOAD: every user from the aclfile, or none (the error)."""
        assert self.aclfile is not None
        try:
            users = self.parse_file(self.aclfile)
        except ValueError as e:
            return str(e)
        if "default" not in users:
            users["default"] = self.open_default()
        kept = {"default"}
        if self.replication is not None:     # the settings', whatever the file says
            users[self.replication[0]] = self.replication_user()
            kept.add(self.replication[0])
        old, self.users = self.users, users
        # As Redis 7.0's ACL LOAD: the old users' connections are closed, but
        # the default user's, which take its new rules (and repl-user's:
        # its rules are the settings', so its replicas stay).
        for user in old.values():
            if user.name in kept:
                for conn in self.connections_of(user):
                    conn.set_user(users[user.name], conn.authenticated)
            else:
                self.disconnect(user)
        self.users_changed()
        return None

    def save_file(self) -> bool:
        """ACL SAVE: a temporary file renamed over the aclfile."""
        assert self.aclfile is not None
        text = "".join(f"user {u.name} {u.describe()}\n" for u in self.sorted_users())
        tmp = f"{self.aclfile}.tmp-{os.getpid()}-{int(time.time() * 1000)}"
        try:
            with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(text)
            os.replace(tmp, self.aclfile)
        except OSError as e:
            self.log.warning("Saving the ACL file %s: %s", self.aclfile, e)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return False
        return True

    def sorted_users(self) -> list[User]:
        """In Redis's order (its users are a radix tree: by name's bytes)."""
        return [self.users[n] for n in sorted(self.users, key=lambda n: n.encode(
            "utf-8", "surrogateescape"))]

    # ---- ACL LOG ------------------------------------------------------------------------

    def log_denial(self, conn, reason: str, obj: str, in_multi: bool,
                   username: str | None = None, client_info: str | None = None) -> None:
        """One ACL LOG entry (or one more of a recent same one), bounded by
        acllog-max-len as Redis's addACLLogEntry; conn is the RESP
        connection, or None (the HTTP front) with client_info given."""
        self.denied[reason] += 1
        if self.log_max_len == 0:
            return
        entry = LogEntry(reason, "multi" if in_multi else "toplevel", obj,
                         username if username is not None else conn.user.name,
                         client_info if client_info is not None else
                         client_line(conn, time.monotonic()))
        for i, current in enumerate(self.entries[:LOG_GROUPING_SCAN]):
            if current.same_event(entry):
                current.count += 1
                current.created_ms = entry.created_ms
                current.client_info = entry.client_info
                self.entries.insert(0, self.entries.pop(i))
                return
        self.entries.insert(0, entry)
        del self.entries[self.log_max_len:]

    def info_sections(self, sections, named):
        out: dict[str, dict] = {}
        if "stats" in sections:
            out["stats"] = {"acl_access_denied_cmd": self.denied["command"],
                            "acl_access_denied_key": self.denied["key"],
                            "acl_access_denied_channel": self.denied["channel"]}
        if "memory" in sections:
            out["memory"] = {"acl_users": len(self.users), "acl_log_entries": len(self.entries),
                             "acllog_max_len": self.log_max_len}
        return out

    def reset_stats(self) -> None:
        self.denied = dict.fromkeys(self.denied, 0)
