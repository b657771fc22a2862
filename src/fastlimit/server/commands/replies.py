"""Replies several areas give in the same words."""

from __future__ import annotations

from fastlimit._resp import SimpleString

OK = SimpleString("OK")
WRONGPASS = "WRONGPASS invalid username-password pair or user is disabled."
