"""The backfill plan's Lua scripts, read once from ``lua/`` (each headed by its KEYS, ARGV and
reply): ``plan.lua`` writes a plan or finds the one it resumes, ``settle.lua`` moves a running
plan to ``done`` or ``cancelled``. Each is one atomic step on the plan's hash."""

from __future__ import annotations

from importlib.resources import files

_LUA = files(__package__) / "lua"

PLAN = (_LUA / "plan.lua").read_text(encoding="utf-8")
SETTLE = (_LUA / "settle.lua").read_text(encoding="utf-8")
