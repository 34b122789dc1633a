"""The agent as the head of its PC's chats, the serving side: the chat service (``service``: answers on the ring,
kept sessions, replays), the OpenAI-style HTTP API (``openai_http``, ``openai_request``), stop sequences and a
prompt's progress. What clients share with it (the endpoint file, the protocol, a client) is ``agent.chat_client``."""
