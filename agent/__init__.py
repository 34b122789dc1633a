"""The shoal agent: stage runtime, head (generation loop), command line."""
