"""Export: checkpoint -> per-stage stateful OpenVINO IR + manifest."""
