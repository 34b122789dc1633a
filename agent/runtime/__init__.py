"""Stage runtime: compile a stage's OpenVINO graph once, run one KV state per session.

Import the modules themselves (``agent.runtime.stage`` needs OpenVINO; ``agent.runtime.config`` does not).
"""
