"""The one error a user's input gets: what was wrong and what to do, in one line."""


class CheckpointError(ValueError):
    """A model directory, an output directory, a text file or a setting that cannot be used; the message says why
    and what to do instead."""
