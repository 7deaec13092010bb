"""Helpers the sources, the node and the tools share: HTTP errors described, retry pacing, paging
tokens, history gaps, and the ASGI plumbing of the node's servers."""
