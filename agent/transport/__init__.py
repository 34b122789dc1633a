"""Ring connections: mutual-TLS contexts (``tls``) and socket liveness tuning (``sockets``)."""
