"""Point-to-point of the ``"mtxcomm"`` backend: ``send`` and ``recv`` (so ``isend``, ``irecv``,
``batch_isend_irecv`` and ``torch.distributed.pipelining``) over the C API's tagged
``mtxcomm_isend`` / ``mtxcomm_irecv`` (``include/mtxcomm/mtxcomm.h``, through ctypes) on the
group's communicator: the engine's world communicator for the world group, the group's own
for the others (``_group.py``).

A send or receive is posted at once on the calling thread; the communicator's progress thread
moves it, so a posted receive never waits for an earlier operation (``irecv``; ``isend``;
``wait`` on both ranks works at every size). ``P2PPending`` gives the request the engine's
pending interface (``done``, ``wait``, ``status``), so ``Work`` serves it as it serves the
collectives. Matching is MPI's: per (peer, tag), in posting order, never against the group's
collectives. A size mismatch fails the receive with ``InvalidUsageError`` naming both byte
counts; nothing is written. Tags: ``[0, 32767]``. A receive from any source
(``recv(src=None)``) is not offered: PyTorch reaches it only through C++ (``recvAnysource``),
which a backend written in Python cannot override.
"""

import ctypes
import threading

from mtxcomm import _arrays, _core
from mtxcomm.torch import _setcomm, _tensors

__all__ = ["P2PPending", "PointToPoint", "post", "world_comm", "MAX_TAG"]

MAX_TAG = 32767
_UINT8 = 1  # MTXCOMM_UINT8: a message is the tensor's bytes (every dtype, complex too)
_TIMEOUT = 5
_FOREVER = 1e9  # seconds: mtxcomm_wait has no "forever"; this is 31 years


class P2PPending:
    """One posted send or receive (see the module's docstring)."""

    def __init__(self, req, comm, what):
        self._req = req
        self._comm = comm
        self._what = what
        self._lock = threading.Lock()
        self._result = None  # (code, message) once complete

    def _complete(self, code):
        """Records the result (the caller saw the request complete) and frees the request."""
        with self._lock:
            if self._result is not None:
                return
            message = ""
            if code:
                raw = _setcomm._library().mtxcomm_get_last_error(self._comm)
                message = "mtxcomm backend: %s: %s" % (
                    self._what,
                    raw.decode(errors="replace") if raw else "error %d" % code,
                )
            self._result = (code, message)
            _setcomm._library().mtxcomm_request_free(self._req)
            self._req = None

    def _in_flight(self):
        """The request while it has not completed, else None."""
        if self._result is not None:
            return None
        with self._lock:
            return self._req

    def done(self):
        req = self._in_flight()
        if req is None:
            return True
        flag = ctypes.c_int(0)
        code = _setcomm._library().mtxcomm_test(req, ctypes.byref(flag))
        if flag.value or code:
            self._complete(code)
            return True
        return False

    def wait(self, timeout=-1.0):
        """Waits up to timeout seconds (< 0 or None: forever); True once complete. Past the
        timeout the group's point-to-point channel has failed (the C API's rule), as the
        Work that waited then reports."""
        req = self._in_flight()
        if req is None:
            return True
        seconds = _FOREVER if timeout is None or timeout < 0 else max(float(timeout), 1e-3)
        code = _setcomm._library().mtxcomm_wait(req, seconds)  # ctypes drops the GIL
        self._complete(code)
        return code != _TIMEOUT

    def status(self):
        self.done()
        return self._result if self._result is not None else (0, "")

    def received_splits(self):
        return []


def post(comm, send, t, peer, tag, what):
    """Posts t (a contiguous CPU tensor's bytes) to or from peer (a rank of comm) with tag;
    returns its P2PPending. comm: a C API communicator handle."""
    if not comm:
        raise RuntimeError("mtxcomm backend: %s: mtxcomm's communicator is not running" % what)
    if not 0 <= int(tag) <= MAX_TAG:
        raise ValueError(
            "mtxcomm backend: %s: tag %d is outside [0, %d] (MPI's least tag bound)"
            % (what, tag, MAX_TAG)
        )
    lib = _setcomm._library()
    req = ctypes.c_void_p()
    nbytes = t.numel() * t.element_size()
    fn = lib.mtxcomm_isend if send else lib.mtxcomm_irecv
    code = fn(t.data_ptr(), nbytes, _UINT8, int(peer), int(tag), comm, ctypes.byref(req))
    if code:
        raw = lib.mtxcomm_get_last_error(comm)
        raise _arrays._error(
            code, "mtxcomm backend: %s: %s" % (what, raw.decode(errors="replace") if raw else "")
        )
    return P2PPending(req, comm, what)


def world_comm():
    """The engine's world communicator (a ctypes handle), or None when it is not running."""
    address = _core.world_comm() if _core.is_initialized() else 0
    return ctypes.c_void_p(address) if address else None


class PointToPoint:
    """send and recv for MtxcommBackend (which provides ``_comm``, ``_submitter``, ``_one``,
    ``_work`` and ``size``)."""

    def _p2p_comm(self):
        return world_comm() if self._comm is None else self._comm._comm

    def _p2p(self, send, tensors, peer, tag):
        what = "send" if send else "recv"
        self._submitter.check_usable()
        t = self._one(tensors, what, "tensor")
        _tensors.check(t, what)
        if not 0 <= peer < self.size():
            raise ValueError(
                "mtxcomm backend: %s: peer %d is not a rank of this group of %d"
                % (what, peer, self.size())
            )
        b = _tensors.Buf(t, what, complex_ok=True)
        p = post(
            self._p2p_comm(),
            send,
            b.view,
            peer,
            tag,
            "%s %s rank %d tag %d" % (what, "to" if send else "from", peer, tag),
        )

        def finish(_):
            if not send:
                b.copy_back()

        return self._work(what, [p], [t], b, finish)

    def send(self, tensors, dstRank, tag):
        return self._p2p(True, tensors, dstRank, tag)

    def recv(self, tensors, srcRank, tag):
        return self._p2p(False, tensors, srcRank, tag)
