"""Errors a user can cause: each message says what is wrong, where, and the fix."""


class Cosmos3Error(Exception):
    """Base of every user-facing cosmos3 error; ``str(err)`` is the whole message."""


class ConfigError(Cosmos3Error):
    """A config.json, quantization config or step policy we cannot honour exactly."""


class CheckpointError(Cosmos3Error):
    """Checkpoint files whose keys, shapes, dtypes or scales do not match the model."""


class PipelineError(Cosmos3Error):
    """A render request the pipeline cannot run (bad size, missing input, ...)."""
