"""Typed errors of the kernels layer; each message is one line a user can act on."""


class KernelsError(Exception):
    """Base of every error raised by a2a_tune.kernels."""


class ShapeError(KernelsError, ValueError):
    """The MoE shape or the inputs cannot run (experts not divisible by ranks, topk > experts...)."""


class UnknownBackendError(KernelsError, KeyError):
    """A backend name that is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class KnobError(KernelsError, ValueError):
    """A knob a backend does not declare, or a value outside its knob space."""


class VirtualRanksError(KernelsError):
    """Virtual ranks (`kernels.virtual`) cannot run this backend, or a rank skipped a signal."""


def import_failure(what: str, exc: BaseException) -> KernelsError:
    """The one line for a library that failed to import: `what`, the exception's type and the
    first line of its message (a missing symbol or library can carry pages after it)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    return KernelsError(f"cannot import {what}: {type(exc).__name__}: {first}")
