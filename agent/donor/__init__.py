"""The donor: a PC that serves the fleet only while its user is away, and steps aside when they come back.

- ``agent.donor.policy``: the pure decision (``decide(readings, settings, previous) -> Decision``).
- ``agent.donor.schedule``: the weekly windows of the ``schedule`` setting.
- ``agent.donor.idle``: the idle sources (seconds since the last keyboard or mouse input), one per desktop.
- ``agent.donor.sensing``: reads the PC (idle source, battery, other programs' load, free memory) into
  :class:`~agent.donor.policy.Readings` for the daemon, which applies the decisions.

This package imports nothing of the agent but its errors.
"""
