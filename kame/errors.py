"""Errors a user can fix; the CLI prints them as one line."""


class UserError(Exception):
    """A problem with input, files or environment, explained in one sentence."""


class CheckpointError(UserError):
    """A checkpoint cannot be found or does not match what it claims to be."""
