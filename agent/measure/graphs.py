"""What the CPU plugin made of each graph: ``python -m agent.measure.graphs DIR [DIR...]``.

Compiles every stage of a shoal export (or an optimum-intel ``openvino_model.xml`` folder) the way
the benchmark does (CPU, one thread) and prints, per graph, the execution precision and the
runtime layer types that decide decode speed: fused ``ScaledDotProductAttention`` and ``RoPE``
(one per layer, two per layer), ``FullyConnected`` and stray ``Reorder`` s, i.e. precision or
layout conversions executed on every inference (conversions of constants are done once at
compile time and are not counted).

A stage that ends in hidden states, not logits, shows about two such Reorders per layer on a bf16
CPU: the plugin keeps in f32 every node between an f32 output and the nearest matrix
multiplication, and in a decoder that is the whole residual stream (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import collections
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WATCHED = ("FullyConnected", "ScaledDotProductAttention", "RoPE", "RMS", "Concatenation", "Reorder")


@dataclass(frozen=True)
class GraphSummary:
    """Runtime layer types of one compiled graph."""

    name: str
    precision: str
    layer_types: dict[str, int]
    runtime_reorders: int
    """Reorders whose input is not a constant: executed on every inference."""


def summarize(xml: Path, name: str, core: Any, threads: int = 1) -> GraphSummary:
    """Compile ``xml`` on the CPU and count its runtime graph's layer types."""
    compiled = core.compile_model(
        str(xml), "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": str(threads)}
    )
    counts: collections.Counter[str] = collections.Counter()
    runtime_reorders = 0
    for op in compiled.get_runtime_model().get_ops():
        kind = _layer_type(op)
        counts[kind] += 1
        if kind == "Reorder" and _layer_type(op.input_value(0).get_node()) != "Const":
            runtime_reorders += 1
    precision = str(compiled.get_property("INFERENCE_PRECISION_HINT"))
    return GraphSummary(name=name, precision=precision, layer_types=dict(counts), runtime_reorders=runtime_reorders)


def _layer_type(op: Any) -> str:
    info = op.get_rt_info()
    return str(info["layerType"].astype(str)) if "layerType" in info else str(op.get_type_name())


def graphs_of(folder: Path) -> list[tuple[str, Path]]:
    """(name, xml) of each graph in a shoal export (its stages) or an optimum-intel folder."""
    if (folder / "manifest.json").is_file():
        from shards.manifest import Manifest

        manifest = Manifest.load(folder)
        return [(f"{_label(folder)}/{stage.name}", folder / stage.xml) for stage in manifest.stages]
    xml = folder / "openvino_model.xml"
    if xml.is_file():
        return [(_label(folder), xml)]
    raise SystemExit(f"{folder}: neither a shoal export (manifest.json) nor an openvino_model.xml folder")


def _label(folder: Path) -> str:
    folder = folder.resolve()
    return f"{folder.parent.name}/{folder.name}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent.measure.graphs", description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import openvino as ov

    core = ov.Core()
    summaries = [summarize(xml, name, core, args.threads) for folder in args.folders for name, xml in graphs_of(folder)]
    width = max(len(s.name) for s in summaries)
    header = "".join(f"{t[:14]:>15}" for t in WATCHED)
    print(f"{'graph':<{width}}  {'precision':<10}{header}{'runtime Reorder':>17}")
    for s in summaries:
        counts = "".join(f"{s.layer_types.get(t, 0):>15}" for t in WATCHED)
        precision = s.precision.split(":")[-1].strip(" >'")[:10]
        print(f"{s.name:<{width}}  {precision:<10}{counts}{s.runtime_reorders:>17}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
