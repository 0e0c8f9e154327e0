"""Errors a user can cause: each message says what is wrong, where, and the fix."""

from __future__ import annotations

from collections.abc import Sequence

FieldProblem = tuple[str, str]  # (field, message): the field a caller set wrongly, the rule it breaks and the fix


class Cosmos3Error(Exception):
    """Base of every user-facing cosmos3 error; ``str(err)`` is the whole message.

    ``problems`` holds the (field, message) pairs the message lists, for callers that place each one
    (the farm maps a field to its manifest line); it is empty when the error is not about a field.
    """

    def __init__(self, message: str, problems: Sequence[FieldProblem] = ()):
        super().__init__(message)
        self.problems = tuple(problems)

    def __reduce__(self):  # keep `problems` across pickling (Ray ships a worker's error to the driver)
        return type(self), (str(self), self.problems)

    @classmethod
    def listing(cls, subject: str, problems: Sequence[FieldProblem]) -> Cosmos3Error:
        """One error listing every problem: ``2 problems in render request:`` then ``  field: message`` lines."""
        header = "1 problem" if len(problems) == 1 else f"{len(problems)} problems"
        return cls(f"{header} in {subject}:\n" + "\n".join(f"  {field}: {message}" for field, message in problems),
                   problems)


class ConfigError(Cosmos3Error):
    """A config.json, quantization config, step policy or load option we cannot honour exactly."""


class CheckpointError(Cosmos3Error):
    """Checkpoint files whose keys, shapes, dtypes or scales do not match the model."""


class PipelineError(Cosmos3Error):
    """A render request the pipeline cannot run (bad size, missing input, ...)."""


class BackgroundLoadError(Cosmos3Error):
    """A component built in the background (``cosmos3.background_build``: the VAE, the sound tokenizer) did not
    build, after the checks that need no diffusers had passed. Every job that needs the component raises it: the
    fault is the load's, never the job's."""


class VAELoadError(BackgroundLoadError):
    """The VAE did not build in diffusers (its weights do not match ``vae/config.json``, or diffusers failed): every
    job needs it."""


class SoundTokenizerLoadError(BackgroundLoadError):
    """The sound tokenizer did not build in diffusers: the jobs with sound raise it; silent ones still render."""
