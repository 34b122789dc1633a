"""What an admin measures on a real PC to choose a split: each stage's decode time (``shoal bench stages``)
and what the device's plugin compiled each graph into. The benchmark harness that compares shoal with other
systems is not here: it lives in ``bench/`` beside ``tests/``."""
