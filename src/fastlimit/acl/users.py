"""Redis-style ACL users: the Acl subsystem, which holds the users (the
default user behind requirepass, repl-user), puts a change of one in
force on its connections, answers who may run what, keeps ACL LOG and
protected mode's refusal.  A user and the ACL SETUSER rules that make it
are rules.py's, the aclfile's format aclfile.py's, ACL LOG's entries
log.py's; the names other modules import from here stay importable here.

A user's permissions are one byte per command id (``User.grant``), which
the connection (_protocol.pyx, ``Connection.acl_denied``) reads in C with
the user's key patterns.  A user that may run everything on every key has
no grant, so its connections pay nothing for ACL.  Users live in Python
because they change only by command; a change hands every connection of
the user its new grant.
"""

from __future__ import annotations

import time

from fastlimit._protocol import Command, acl_check
from fastlimit.acl.aclfile import NO_ACLFILE as NO_ACLFILE  # (re-exported: acl/commands.py)
from fastlimit.acl.aclfile import parse_aclfile, write_aclfile
from fastlimit.acl.log import LogEntry, add_entry
from fastlimit.acl.rules import CHANNEL_COMMANDS, Commands, RuleError, User, has_spaces
from fastlimit.server.clients import client_line
from fastlimit.server.config import ConfigError
from fastlimit.server.subsystem import Subsystem

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

# repl-user's rules besides its password (repl-password): what a replica's
# link sends after its AUTH (CL.SYNC, then REPLCONF listening-port,
# ip-address and ACK), and a peer region's link (CL.REGIONSYNC,
# CL.REGIONDEMAND, CL.REGIONSHARES, CL.REGIONCHECK, PING),
# and nothing else: no key, no channel.
REPLICATION_RULES = (b"reset", b"on", b"+cl.sync", b"+replconf", b"+cl.regionsync",
                     b"+cl.regiondemand", b"+cl.regionshares", b"+cl.regioncheck", b"+ping")


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
        if wanted is not None and (wanted[0] == "default" or has_spaces(
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
        if has_spaces(name.encode("utf-8", "surrogateescape")):
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

    def load_file(self) -> str | None:
        """ACL LOAD: every user from the aclfile, or none (the error)."""
        assert self.aclfile is not None
        try:
            users = parse_aclfile(self.aclfile, self.new_user, self.commands)
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
        return write_aclfile(self.aclfile, self.sorted_users(), self.log)

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
        add_entry(self.entries, entry, self.log_max_len)

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
