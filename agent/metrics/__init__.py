"""The agent's figures for monitoring: Prometheus metrics over its status document."""
