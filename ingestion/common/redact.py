"""Credentials kept out of whatever is shown: a URL's userinfo and its secret-looking query
parameters, wherever they appear in a text. Pure.

A Horizon or Stellar RPC provider's URL often carries its API key (``https://KEY@rpc.example``,
``https://rpc.example/?apikey=KEY``), a database's its password (``postgres://u:PW@db``,
``password=PW``). Redacted where such a text is written for others to read (logs, audit entries)
and again where it is shown (the console, ``inspect``), so that an entry written before this rule,
or by a path that forgot it, is not shown whole either.
"""

from __future__ import annotations

import re

MASK = "***"
# scheme://userinfo@ : userinfo is user:password (the user kept) or a lone token (all of it masked)
_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://)([^\s/?#]+)@", re.IGNORECASE)  # (to its last @)
# name=value, in a query string or a libpq keyword string, whose name says it is a secret
# (``password``, ``token``, ``api_key``, ``apikey``, ``auth``, ``sig``, ...; not the project's own
# ``paging_token`` and ``fencing_token``, which are positions, not secrets)
_SECRET_PARAMETER = re.compile(
    r"((?:^|[?&;\s])(?!paging_token=|fencing_token=)[a-z0-9_.-]*"
    r"(?:pass|passwd|password|pwd|token|secret|key|auth|authorization|sig|signature|credentials?)=)[^&#\s]*",
    re.IGNORECASE,
)


def _masked_userinfo(m: re.Match[str]) -> str:
    user, colon, _secret = m.group(2).partition(":")
    return f"{m.group(1)}{user}:{MASK}@" if colon else f"{m.group(1)}{MASK}@"


def redact(text: str) -> str:
    """``text`` with every URL's password or token (``user:***@``, ``***@``) and every secret
    query parameter (``?token=***``, ``&api_key=***``, ``password=***``) masked. Never raises."""
    if "://" not in text and "=" not in text:
        return text
    return _SECRET_PARAMETER.sub(rf"\1{MASK}", _USERINFO.sub(_masked_userinfo, text))
