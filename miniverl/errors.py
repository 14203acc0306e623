"""Error types. Every error the CLI can show is one of these: one line, no traceback."""


class MiniverlError(Exception):
    """Base class. ``exit_code`` is what the CLI returns."""

    exit_code = 1


class UsageError(MiniverlError):
    """Bad arguments or bad configuration: the user must change what they asked for."""

    exit_code = 2


class ConfigError(UsageError):
    """A config file or ``--set`` override is malformed, unknown or inconsistent."""


class DataError(UsageError):
    """A dataset is missing, empty, has the wrong columns or changed since ``plan``."""


class ModelSourceError(MiniverlError):
    """A model cannot be found, fetched, or its content does not match its pin."""


class CheckpointError(MiniverlError):
    """A checkpoint is missing, partial or corrupt."""


class ExportError(MiniverlError):
    """An adapter export failed or did not reload faithfully."""


class DependencyError(MiniverlError):
    """An optional dependency (the ``train`` or ``cuda`` extra) is missing."""
