"""Shards: export a checkpoint into per-stage OpenVINO graphs, describe them in a manifest, verify them.

The export runs once, on an admin's machine; the stage runtime (``agent.runtime``) only ever reads
what this package wrote, through :class:`shards.manifest.Manifest`.
"""
