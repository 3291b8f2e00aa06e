"""Rendezvous and communicator setup of the ``"mtxcomm"`` backend.

``init_engine`` starts mtxcomm's engine for a process group (once per process; later groups
share it): under ``mpirun``/``mtxrun`` or with ``MTXCOMM_STORE`` set through mtxcomm's own
bootstrap, otherwise through the c10d ``Store`` PyTorch hands the backend (rank 0 opens
mtxcomm's TCP bootstrap store and publishes its address and a fresh job secret under
``mtxcomm/bootstrap``; see ``backend.py``'s docstring). ``launched()`` says whether a launcher
(or ``MTXCOMM_STORE``) set up mtxcomm's world, which the Horovod-style ``init`` asks too.
"""

import json
import os
import secrets
import socket

from mtxcomm import _arrays, _core

__all__ = ["LAUNCHER_VARS", "launched", "init_engine", "need_init", "restore_environ"]

_STORE_KEY = "mtxcomm/bootstrap"

LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "MTXCOMM_STORE")


def launched():
    """True when mpirun/mtxrun (or MTXCOMM_STORE) makes mtxcomm's world, not a c10d store."""
    return any(os.environ.get(v) for v in LAUNCHER_VARS)


def _free_port(host):
    """A TCP port free on host (an address of this machine), or None when host is not local."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except OSError:
        return None
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind(addr[:2] if family == socket.AF_INET else addr)
                return s.getsockname()[1]
        except OSError:
            continue
    return None


def _bootstrap_address():
    """'host:port' where rank 0 can open mtxcomm's bootstrap store for the others to reach."""
    candidates = []
    if os.environ.get("MASTER_ADDR"):
        candidates.append(os.environ["MASTER_ADDR"])
    try:
        candidates.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    candidates.append("127.0.0.1")
    for host in candidates:
        port = _free_port(host)
        if port is not None:
            return "%s:%d" % (host, port)
    raise RuntimeError(
        "mtxcomm backend: rank 0 found no local address to open mtxcomm's "
        "bootstrap store on (tried %s)" % ", ".join(candidates)
    )


def init_engine(store, rank, size, timeout):
    """Starts mtxcomm's engine (collective over the group's ranks) unless it runs."""
    if not _core.is_initialized():
        if size > 1 and not launched():
            _init_through_store(store, rank, size, timeout)
        else:
            _arrays.init()
    if _core.size() != size or _core.rank() != rank:
        raise RuntimeError(
            "mtxcomm backend: the process group is rank %d of %d but mtxcomm's world (from "
            "%s) is rank %d of %d; launch with one launcher (torchrun, or mtxrun/mpirun) or "
            "unset MTXCOMM_STORE" % (rank, size, _launcher(), _core.rank(), _core.size())
        )


def _launcher():
    for v in LAUNCHER_VARS:
        if os.environ.get(v):
            return "%s=%s" % (v, os.environ[v])
    return "an earlier init"


def _init_through_store(store, rank, size, timeout):
    if rank == 0:
        info = {"store": "tcp:" + _bootstrap_address(), "secret": secrets.token_hex(32)}
        store.set(_STORE_KEY, json.dumps(info))
    else:
        store.wait([_STORE_KEY], timeout)
        info = json.loads(bytes(store.get(_STORE_KEY)).decode())
    env = {
        "MTXCOMM_RANK": str(rank),
        "MTXCOMM_SIZE": str(size),
        "MTXCOMM_STORE": info["store"],
        "MTXCOMM_JOB_SECRET": info["secret"],
    }
    saved = {k: os.environ.get(k) for k in list(env) + ["MTXCOMM_JOB_SECRET_FILE"]}
    os.environ.update(env)
    os.environ.pop("MTXCOMM_JOB_SECRET_FILE", None)
    try:
        _arrays.init()
        # Every rank has joined (init is collective): the address and the secret are of no
        # more use in the c10d store, where anyone who reaches it could read them.
        if rank == 0:
            try:
                store.delete_key(_STORE_KEY)
            except Exception:  # noqa: BLE001 - a store without delete: the key stays
                pass
    finally:
        # The secret is not left for child processes to inherit.
        restore_environ(saved)


def restore_environ(saved):
    """Puts back the environment variables saved ({name: value, or None where unset})."""
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def need_init(what):
    """Raises unless mtxcomm runs (what: the mtxcomm.torch function called)."""
    if not _core.is_initialized():
        raise ValueError(
            "mtxcomm.torch.%s: mtxcomm has not been initialized; call "
            "mtxcomm.torch.init() first" % what
        )
