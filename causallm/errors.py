"""Errors a user can cause: bad config, bad property, bad weight file, bad prompt.

Each is raised with one line that names the file, key or layer and says what was expected;
the CLI prints it as ``error: <message>`` and exits with status 2.
"""


class CausalLMError(ValueError):
    """A user-facing error with a one-line message."""
