"""What every framework binding of mtxcomm exposes the same way (Horovod's ``horovod/common``).

- ``exit_handling``: ending the job when a rank ends on an error (``exiting_on_error``), the
  engine's shutdown at exit, the check for an exception that ended the program;
- ``build_flags``: Horovod's build queries (``mpi_built()``, ``nccl_built()``...) answered for
  mtxcomm from a binding's engine module;
- ``basics``: the process facts (``rank()``, ``size()``, ``local_rank()``...) of a binding's
  engine module, refused before ``init()``;
- ``compression``: Horovod's ``Compression.none`` / ``Compression.fp16``, written once over a
  framework's dtypes and cast.

Nothing here imports a framework, the array API (``mtxcomm._arrays``) or a package's
``__init__``: the frameworks' modules import these, never the other way round.
"""
