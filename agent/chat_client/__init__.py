"""The client side of the agent's chat endpoint, what ``shoal ask``, the TUI and the agent's chat service share:
the endpoint file (``endpoint``: where this PC's agent serves chats, and its access token), the line protocol
(``protocol``: requests and events, validated where they are read) and a client (``client``). The serving side
is ``agent.chat``."""
