"""The HTTP sources' URLs are checked by one rule (:func:`ingestion.common.http.source_urls`),
where Horizon's and RPC's each had a copy, and name the source in what they refuse."""

from __future__ import annotations

import pytest

from ingestion.common.http import source_urls
from ingestion.horizon.source import _urls as horizon_urls
from ingestion.rpc.source import _urls as rpc_urls


@pytest.mark.parametrize("bad", ["ftp://h/x", "http://", "127.0.0.1:8000", "horizon.example"])
@pytest.mark.parametrize(("check", "what"), [(horizon_urls, "Horizon"), (rpc_urls, "RPC")])
def test_each_source_refuses_a_url_without_http_and_a_host(check, what, bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=f"^{what} URL .* must be an http:// or https:// URL with a host"):
        check(["https://ok.example", bad])


def test_one_url_or_several_and_none_is_refused() -> None:
    assert source_urls("https://a.example", "Horizon") == ("https://a.example",)
    assert source_urls(["http://a:1", "https://b"], "RPC") == ("http://a:1", "https://b")
    with pytest.raises(ValueError, match="at least one RPC URL is needed"):
        source_urls([], "RPC")
