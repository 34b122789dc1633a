"""Ring connections: mutual-TLS contexts (``tls``), socket liveness tuning (``sockets``), and the
tasks a server owns (``tasks``)."""
