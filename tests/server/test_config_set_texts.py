"""CONFIG SET's error texts, byte for byte against a real redis-server
for the settings both have, and every setting CONFIG GET * lists taking
its own value back or answering Redis's immutable error (issue 16)."""

from __future__ import annotations

import pytest
import redis

from wire import Wire


@pytest.fixture(params=["fastlimit", "redis"])
def port(request, server, redis_server):
    return server.port if request.param == "fastlimit" else redis_server.port


@pytest.mark.parametrize("args, expected", [
    (("daemonize", "yes"), b"-ERR CONFIG SET failed (possibly related to argument 'daemonize') - "
                           b"can't set immutable config\r\n"),
    (("databases", "3"), b"-ERR CONFIG SET failed (possibly related to argument 'databases') - "
                         b"can't set immutable config\r\n"),
    (("hz", "10", "HZ", "11"), b"-ERR CONFIG SET failed (possibly related to argument 'HZ') - "
                               b"duplicate parameter\r\n"),       # named as sent
    (("Daemonize", "yes"), b"-ERR CONFIG SET failed (possibly related to argument 'Daemonize') - "
                           b"can't set immutable config\r\n"),
    (("HZ", "abc"), b"-ERR CONFIG SET failed (possibly related to argument 'hz') - "
                    b"argument couldn't be parsed into an integer\r\n"),  # the setting's name
    (("hz", "abc"), b"-ERR CONFIG SET failed (possibly related to argument 'hz') - "
                    b"argument couldn't be parsed into an integer\r\n"),
    (("maxclients", "10", "hz", "x"), b"-ERR CONFIG SET failed (possibly related to argument "
                                      b"'hz') - argument couldn't be parsed into an integer\r\n"),
    (("no-such-setting", "1"), b"-ERR Unknown option or number of arguments for CONFIG SET - "
                               b"'no-such-setting'\r\n"),
    (("hz",), b"-ERR wrong number of arguments for 'config|set' command\r\n"),
    (("hz", "10", "maxclients"), b"-ERR syntax error\r\n"),
])
def test_errors_as_redis(port, args, expected):
    with Wire.to(port) as w:
        before = w.call("CONFIG", "GET", "maxclients")
        assert w.call("CONFIG", "SET", *args) == expected
        assert w.call("CONFIG", "GET", "maxclients") == before


def test_every_setting_takes_its_own_value_or_is_immutable(make_server):
    srv = make_server()
    c = redis.Redis(port=srv.port, decode_responses=True)
    settings = c.config_get("*")
    immutable = []
    for name, value in settings.items():
        try:
            assert c.config_set(name, value) is True
        except redis.ResponseError as e:
            assert str(e) == (f"CONFIG SET failed (possibly related to argument '{name}') - "
                              "can't set immutable config"), name
            immutable.append(name)
        assert c.config_get(name) == {name: value}, name
    # bind and port change at runtime now (as in Redis 7), so they take their value
    assert "bind" not in immutable and "port" not in immutable
    assert c.ping() is True
    c.close()
