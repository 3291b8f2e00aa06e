"""Put first on PYTHONPATH by ``mtxrun --transparent``: makes the script data-parallel (see
mtxcomm.transparent), then runs any other sitecustomize the environment has."""

import importlib.machinery
import importlib.util
import os
import sys


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _owner():
    """Whether this process is the rank's own program: the first Python process of the rank
    claims the transparent mode (its pid, inherited by its children); a Python child it starts
    (a subprocess, a data-loading worker) stays an ordinary process, which neither joins the
    job nor starts MPI."""
    owner = os.environ.get("_MTXRUN_TRANSPARENT_PID")
    if owner is None:
        os.environ["_MTXRUN_TRANSPARENT_PID"] = str(os.getpid())
        return True
    return owner == str(os.getpid())


if os.environ.get("MTXCOMM_TRANSPARENT") == "1" and _owner():
    try:
        from mtxcomm import transparent as _transparent
    except ImportError as e:
        sys.stderr.write(
            "mtxrun --transparent: this Python (%s) cannot import mtxcomm (%s); run "
            "the script with the Python of the environment mtxcomm is installed "
            "in\n" % (sys.executable, e)
        )
        raise SystemExit(2) from None
    _transparent.install()
_chain()
