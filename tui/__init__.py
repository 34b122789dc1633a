"""``shoal chat``: the terminal UI (Textual), a client of this PC's agent (its chat endpoint and its status).

- ``app``: :class:`~tui.app.ChatApp`, the state, the bindings and the workers; ``app.tcss``: every style;
- what the workers run, by role: ``answer_stream`` (an answer's events), ``fleet_polls`` (the agents' statuses
  and the fleet report), ``store_jobs`` (the SQLite store's jobs);
- the widgets, one a file: ``conversation``, ``message``, ``prompt_input``, ``fleet_view``, ``throughput``,
  ``status_line``; the dialogs ``settings`` and ``history``; the admin's screen ``admin_screen`` and its
  dialogs ``pin_dialog`` and ``confirm_dialog``;
- what they show, as plain values: ``fleet`` (the report of a status document), ``answer`` (an answer's
  tally and stats line), ``generation`` (the request's settings), ``events`` (the workers' messages);
- where data comes from: ``sources`` (the chat and status sources, behind Protocols) and ``store``
  (conversations in SQLite).

It imports ``agent.chat_client`` (the endpoint file, the protocol and a client) and ``agent.errors``, never the
serving ``agent.chat`` nor the agent's runtime: the command line (``agent/cli/chat_cmd.py``) hands it the status
link.
"""
