"""huggingface_hub's shared HTTP client, made to survive a mirror that drops out.

huggingface_hub (1.21) sends every request through one shared ``httpx.Client``. When a connection is refused
(a mirror whose host went away), its retry loop (``utils/_http.py``, ``_http_backoff_base``) closes that shared
client and then retries on the very client it closed: ``RuntimeError: Cannot send a request, as the client has
been closed`` on every retry, and the whole download fails although the mirror may be back a second later
(upstream: huggingface/huggingface_hub#4673, closed as intended).

:func:`keep_client_usable` installs, through the library's own ``set_client_factory``, a client whose
``close()`` drops its pooled connections but leaves it usable: the library's retries then open new connections,
as they mean to. Everything else about the client is as the library set up the client it replaces (its request
hook, redirects, timeouts, headers).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
from huggingface_hub import get_session, set_client_factory

_installing = threading.Lock()


class ReopeningClient(httpx.Client):
    """An ``httpx.Client`` that a ``close()`` does not end: it closes the open connections, and the next request
    opens a new one."""

    def close(self) -> None:
        # httpx.Client.close() would also mark the client closed for good; only the connections are dropped here
        self._transport.close()
        for transport in self._mounts.values():
            if transport is not None:
                transport.close()


def reopening_like(client: httpx.Client) -> Callable[[], httpx.Client]:
    """A client factory making :class:`ReopeningClient` s set up as ``client`` is."""
    settings = {
        "event_hooks": client.event_hooks,
        "follow_redirects": client.follow_redirects,
        "timeout": client.timeout,
        "headers": client.headers,
    }
    return lambda: ReopeningClient(**settings)  # type: ignore[arg-type]


def keep_client_usable() -> None:
    """Make huggingface_hub's shared client a :class:`ReopeningClient` (once per process; cheap after that)."""
    if isinstance(get_session(), ReopeningClient):
        return
    with _installing:
        current = get_session()
        if not isinstance(current, ReopeningClient):
            set_client_factory(reopening_like(current))
