"""shoal's error tree. Every error a user can meet derives from :class:`ShoalError`.

::

    ShoalError
    ├── SourceError            the model to export cannot be found or read
    │   ├── UnsupportedModelError   an architecture shoal does not export
    │   └── CorruptCheckpointError  a truncated or malformed checkpoint file
    ├── ExportError            the export itself failed (bad options, conversion failure)
    ├── ManifestError          a manifest is missing, malformed or of an unknown version
    │   └── IntegrityError          a file does not match the manifest's size or sha256
    └── RuntimeStageError      a stage cannot be compiled or run (device, shapes)

Foreign exceptions (OpenVINO, gguf, transformers) are mapped to these at the boundary with
``raise ... from exc`` so that the command line can print one line and exit non-zero.
"""


class ShoalError(Exception):
    """Root of every error shoal raises on purpose."""


class SourceError(ShoalError):
    """The model source cannot be found or read."""


class UnsupportedModelError(SourceError, ValueError):
    """The checkpoint's architecture is not one shoal can export."""


class CorruptCheckpointError(SourceError):
    """A checkpoint file is truncated or malformed."""


class ExportError(ShoalError):
    """The export could not be completed."""


class ManifestError(ShoalError):
    """A manifest is missing, malformed or of an unsupported version."""


class IntegrityError(ManifestError):
    """A file on disk does not match what the manifest records."""


class RuntimeStageError(ShoalError):
    """A stage cannot be compiled or run."""
