"""The one error a user's input gets: what was wrong and what to do, in one line."""


class CheckpointError(ValueError):
    """A model directory, an output directory, a text file or a setting that cannot be used; the message says why
    and what to do instead."""


def need(ok: bool, message: str, error: type[Exception] = ValueError) -> None:
    """The one check the library's settings are validated with: ``error(message)`` unless ``ok``."""
    if not ok:
        raise error(message)


def field_check(obj, error: type[Exception] = ValueError, qualified: bool = True):
    """:func:`need` for the fields of a settings object, as ``check(ok, name, what)``: the message is always
    "``Class.name=value`` is invalid: must be ``what``" (without the class where ``qualified`` is false)."""
    prefix = f"{type(obj).__name__}." if qualified else ""

    def check(ok: bool, name: str, what: str) -> None:
        need(ok, f"{prefix}{name}={getattr(obj, name)!r} is invalid: must be {what}", error)
    return check
