"""The lease store's Lua scripts, read once from ``lua/``.

Every atomic step of the election and every fenced write is a script of its own in ``lua/``, headed
by a comment naming its KEYS and ARGV and what it returns, so that it is read and reviewed as a
script. ``lua/helpers.lua`` holds the functions several scripts share; it is prepended to each
(a Redis script cannot call another).
"""

from __future__ import annotations

from importlib.resources import files

_LUA = files(__package__) / "lua"


def _read(name: str) -> str:
    return (_LUA / f"{name}.lua").read_text(encoding="utf-8")


HELPERS = _read("helpers")


def _script(name: str) -> str:
    return HELPERS + "\n" + _read(name)


ACQUIRE = _script("acquire")
RENEW = _script("renew")
RELEASE = _script("release")
COMMIT = _script("commit")
FENCED_HSET = _script("fenced_hset")
FENCED_AUDIT = _script("fenced_audit")
NODE_HEARTBEAT = _script("node_heartbeat")
REPORT_HEALTH = _script("report_health")
DEPLOYMENT_ID = _script("deployment_id")
CURSOR_RESET = _script("cursor_reset")
CURSOR_RESERVE = _script("cursor_reserve")
CURSOR_RESET_SINK = _script("cursor_reset_sink")
