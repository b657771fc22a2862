"""The harness itself: a server starts, answers, and stops cleanly."""


def test_ping_and_check(r):
    assert r.ping() is True
    assert r.execute_command("CL.CHECK", "k", 5, 2) == [1, 5, 4, 0, 500]
