"""The process facts every binding exposes (Horovod's ``rank()``, ``size()``, ``local_rank()``,
``local_size()``, ``cross_rank()``, ``cross_size()``), read from the binding's engine module and
refused before ``init()``.

A binding makes one ``Basics`` over its engine module and exports its bound methods under
those names (as Horovod's frameworks do with ``horovod.common.basics.HorovodBasics``)::

    _basics = Basics(_engine, started=lambda: _engine.rank() >= 0,
                     not_started="mtxcomm.tensorflow.%s(): ... call hvd.init() first")
    rank = _basics.rank

``init``, ``shutdown`` and ``is_initialized`` stay with each binding: they differ in what they
do (TensorFlow sizes its thread pools and shuts its engine down itself; torch may start through
``torch.distributed.init_process_group`` and shuts down through the array API).
"""


class Basics:
    """The process facts of one binding's engine.

    Args:
      engine: the binding's engine module: rank(), size(), local_rank(), local_size().
      started: a function () -> bool, whether the engine was initialised.
      not_started: the message of the ValueError raised before init(), with one ``%s``
        where the called function's name goes.
    """

    def __init__(self, engine, started, not_started):
        self._engine = engine
        self._started = started
        self._not_started = not_started

    def check_init(self, what):
        """Raises ValueError (not_started, naming ``what``) before init()."""
        if not self._started():
            raise ValueError(self._not_started % what)

    def rank(self):
        """This process's rank in [0, size()). Raises ValueError before init()."""
        self.check_init("rank")
        return self._engine.rank()

    def size(self):
        """The number of ranks. Raises ValueError before init()."""
        self.check_init("size")
        return self._engine.size()

    def local_rank(self):
        """This process's index among the ranks on its node (ordered by rank). Raises
        ValueError before init()."""
        self.check_init("local_rank")
        return self._engine.local_rank()

    def local_size(self):
        """The number of ranks on this node. Raises ValueError before init()."""
        self.check_init("local_size")
        return self._engine.local_size()

    def cross_rank(self):
        """Index of this node among the nodes (ranks are assumed packed by node, as mpirun
        does)."""
        return self.rank() // self.local_size()

    def cross_size(self):
        """Number of nodes (ranks packed by node, the same number on every node)."""
        return self.size() // self.local_size()

    def is_homogeneous(self, allgather_object):
        """True when every node runs the same number of ranks. allgather_object(obj, name=...)
        is the binding's object allgather (collective: every rank must call this)."""
        self.check_init("is_homogeneous")
        return (
            self.size() % self.local_size() == 0
            and len(set(allgather_object(self.local_size(), name="mtxcomm.is_homogeneous"))) == 1
        )
