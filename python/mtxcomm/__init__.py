"""mtxcomm: collective communication for data-parallel deep learning.

The C library (allreduce, broadcast, allgather, reduce-scatter over shared memory, MPI and TCP)
is used from Python through its framework bindings:

- ``mtxcomm.tensorflow`` and ``mtxcomm.tensorflow.keras``: a Horovod-compatible API for
  TensorFlow 2 / Keras 3 (``import mtxcomm.tensorflow.keras as hvd``).
- ``mtxrun``: launches N processes through Open MPI's ``mpirun``; with ``--transparent`` an
  unmodified Keras script trains data-parallel.
"""

__version__ = "0.1.0"
