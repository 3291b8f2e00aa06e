"""Interpreter start under ``mtxrun --transparent``: :func:`install` (called by the
``sitecustomize`` that mtxrun puts first on ``PYTHONPATH``) sends the standard output of ranks
other than 0 to /dev/null and puts an import hook first on ``sys.meta_path``, which patches Keras
(``_keras_import``) right after the top-level ``keras`` package has been executed. This module
imports nothing but the standard library: it is loaded in every rank's interpreter before the
script runs, and the rest of the package is loaded with Keras."""

import os
import sys
import threading

_installed = False
_lock = threading.Lock()


def _env_rank():
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MTXCOMM_RANK", "PMI_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def install():
    """Called by the sitecustomize that mtxrun --transparent puts on PYTHONPATH."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    if _env_rank() != 0 and os.environ.get("MTXCOMM_TRANSPARENT_OUTPUT", "rank0") != "all":
        sys.stdout = open(os.devnull, "w")
    sys.meta_path.insert(0, _KerasImportHook())


class _KerasImportHook:
    """Runs _patch_keras right after the top-level keras package has been executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "keras":
            return None
        sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _KerasImportHook)]
            from ._keras_import import _patch_keras  # (the rest of the package, with Keras)

            _patch_keras(module)

        loader.exec_module = exec_module
        return spec
