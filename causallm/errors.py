"""Errors a user can cause: bad config, bad property, bad weight file, bad prompt.

Each is raised with one line that names the file, key or layer and says what was expected;
the CLI prints it as ``error: <message>`` and exits with status 2.
"""


class CausalLMError(ValueError):
    """A user-facing error with a one-line message."""


def utf8(raw: bytes, what: str) -> str:
    """``raw`` decoded as UTF-8, or a CausalLMError naming ``what`` and its first invalid byte
    (``PROMPT is not valid UTF-8: byte 0xe9 at offset 3``)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CausalLMError(f"{what} is not valid UTF-8: byte 0x{raw[e.start]:02x} at offset "
                            f"{e.start}") from None


def unicode(text: str, what: str) -> str:
    """``text`` if UTF-8 can hold it, else a CausalLMError naming ``what`` and its first lone
    surrogate (a str of bytes decoded with surrogateescape: ``PROMPT is not valid Unicode: a
    lone surrogate U+DCE9 at offset 3``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise CausalLMError(f"{what} is not valid Unicode: a lone surrogate "
                            f"U+{ord(text[e.start]):04X} at offset {e.start}") from None
    return text
