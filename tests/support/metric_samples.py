"""Prometheus text as ``{name{labels}: value}``, the form the metrics tests compare."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def metric_samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample (labels other than ``node`` written out, sorted)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "node")
            found[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return found
