"""The exception classes horovod.torch exports (Horovod's ``horovod/common/exceptions``), for
code that names them. mtxcomm's own errors are ``mtxcomm.Error`` and its subclasses (a
``RuntimeError``; a disagreement between ranks is ``InvalidUsageError``, a bad argument
``InvalidArgumentError``, also a ``ValueError``): a failed collective raises those, not
``HorovodInternalError``, which Horovod's elastic mode catches to restore state (mtxcomm has
no elastic mode, so nothing would restore it)."""

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]


class HorovodInternalError(RuntimeError):
    """Horovod's error of a failed collective (elastic mode)."""


class HostsUpdatedInterrupt(RuntimeError):
    """Horovod's interrupt when the hosts of an elastic job change."""

    def __init__(self, skip_sync=False):
        super().__init__()
        self.skip_sync = skip_sync
