"""The agent daemon: serves its stage(s) of an export on the ring."""
