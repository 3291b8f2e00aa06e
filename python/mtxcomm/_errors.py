"""The array API's errors (``mtxcomm.Error`` and its subclasses, re-exported by ``_arrays``), and
``_error``, which turns a C API result code and message into the matching one; the framework
bindings raise them too.
"""

import builtins

# The C API's mtxcomm_result_t.
_CODE_NAMES = {
    0: "MTXCOMM_SUCCESS",
    1: "MTXCOMM_INVALID_ARGUMENT",
    2: "MTXCOMM_INVALID_USAGE",
    3: "MTXCOMM_SYSTEM_ERROR",
    4: "MTXCOMM_REMOTE_ERROR",
    5: "MTXCOMM_TIMEOUT",
    6: "MTXCOMM_CUDA_ERROR",
    7: "MTXCOMM_INTERNAL_ERROR",
    8: "MTXCOMM_UNSUPPORTED",
}
_INVALID_ARGUMENT, _INVALID_USAGE, _REMOTE_ERROR, _TIMEOUT = 1, 2, 4, 5


class Error(RuntimeError):
    """A failure reported by mtxcomm. ``code`` is the C API's ``mtxcomm_result_t`` (an int),
    ``code_name`` its name (``"MTXCOMM_SYSTEM_ERROR"``); the message is the library's (it names
    this rank and the call). Raised as is for system, internal and unsupported errors; the
    subclasses below for the others."""

    def __init__(self, message, code=7):
        super().__init__(message)
        self.code = int(code)
        self.code_name = _CODE_NAMES.get(self.code, str(self.code))


class InvalidArgumentError(Error, ValueError):
    """MTXCOMM_INVALID_ARGUMENT: a request wrong in itself, refused on every rank (a root out of
    range, alltoall splits that do not add up, a scalar to gather, avg on bool, adasum on an
    integer); also a ``ValueError``."""


class InvalidUsageError(Error):
    """MTXCOMM_INVALID_USAGE: a call not allowed now: before ``init()`` or after ``shutdown()``,
    or ranks that disagree on a call (collective, op, root, dtype, shape); the message names the
    ranks and what each passed."""


class RemoteError(Error):
    """MTXCOMM_REMOTE_ERROR: a peer died, aborted or shut down before this call could run."""


class TimeoutError(builtins.TimeoutError):
    """MTXCOMM_TIMEOUT: a peer did not answer within ``MTXCOMM_TIMEOUT`` seconds, or a call
    waited longer than ``MTXCOMM_STALL_TIMEOUT`` for ranks that never made it. A subclass of the
    built-in ``TimeoutError`` (an ``OSError``, which cannot also be a ``RuntimeError``, so not
    an ``Error``); it has ``code`` and ``code_name`` as ``Error`` has."""

    def __init__(self, message, code=_TIMEOUT):
        super().__init__(message)
        self.code = int(code)
        self.code_name = _CODE_NAMES.get(self.code, str(self.code))


_ERROR_CLASSES = {
    _INVALID_ARGUMENT: InvalidArgumentError,
    _INVALID_USAGE: InvalidUsageError,
    _REMOTE_ERROR: RemoteError,
    _TIMEOUT: TimeoutError,
}


def _error(code, message):
    return _ERROR_CLASSES.get(code, Error)(message, code)
