"""Horovod's elastic state objects, for scripts written against ``hvd.elastic``.

mtxcomm jobs have a fixed set of ranks: a rank that fails ends the job with an error on every
rank (no re-rendezvous, no new workers). What a script gets here is the state bookkeeping —
``sync()`` makes every rank hold rank 0's variables and attributes, ``commit()`` remembers the
current values, ``restore()`` goes back to the last commit — and ``run(func)``, which syncs the
state and calls ``func(state, ...)`` once. See the README's "Differences from Horovod".
"""

import copy
import functools

import tensorflow as tf

from mtxcomm.tensorflow.functions import _run, broadcast_object, broadcast_variables


class State:
    """Attributes given as keyword arguments (e.g. epoch, batch) that sync() takes from rank 0
    and restore() resets to their last committed values."""

    def __init__(self, **kwargs):
        self._reset_callbacks = []
        self._attrs = list(kwargs)
        for k, v in kwargs.items():
            setattr(self, k, v)
        self._saved_attrs = {}

    def register_reset_callbacks(self, callbacks):
        """Kept for Horovod's API: the ranks never change, so they are never called."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for cb in self._reset_callbacks:
            cb()

    def check_host_updates(self):
        """Horovod raises here when workers were added or removed: mtxcomm's never are."""

    def save(self):
        self._saved_attrs = {k: copy.deepcopy(getattr(self, k)) for k in self._attrs}

    def restore(self):
        for k, v in self._saved_attrs.items():
            setattr(self, k, copy.deepcopy(v))

    def sync(self):
        if self._attrs:
            values = broadcast_object(
                {k: getattr(self, k) for k in self._attrs},
                root_rank=0,
                name="mtxcomm.elastic.attrs",
            )
            for k, v in values.items():
                setattr(self, k, v)
        self.save()

    def commit(self):
        """Remembers the current values (restore() goes back to them)."""
        self.save()
        self.check_host_updates()


class ObjectState(State):
    """State of picklable attributes only."""


class TensorFlowState(State):
    """State of TensorFlow variables (default: every global variable of a TF1 graph) and
    attributes."""

    def __init__(self, variables=None, session=None, **kwargs):
        self._session = session
        if variables is None:
            variables = tf.compat.v1.global_variables()
        self.variables = list(variables)
        self._saved_values = None
        super().__init__(**kwargs)

    def _values(self):
        return _run([tf.convert_to_tensor(v) for v in self.variables], self._session)

    def _assign(self, values):
        if tf.executing_eagerly():
            for v, x in zip(self.variables, values):
                v.assign(x)
        else:
            _run(tf.group(*[v.assign(x) for v, x in zip(self.variables, values)]), self._session)

    def save(self):
        self._saved_values = [x.copy() for x in self._values()]
        super().save()

    def restore(self):
        if self._saved_values is not None:
            self._assign(self._saved_values)
        super().restore()

    def sync(self):
        if self.variables:
            op = broadcast_variables(self.variables, root_rank=0)
            if op is not None:
                _run(op, self._session)
        super().sync()


class TensorFlowKerasState(TensorFlowState):
    """State of a Keras model (and its optimizer's variables) and attributes."""

    def __init__(self, model, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        variables = list(model.variables)
        if self.optimizer is not None:
            variables += list(getattr(self.optimizer, "variables", []))
        super().__init__(variables=variables, **kwargs)


def run(func):
    """Decorator: ``func(state, *args)`` runs once, after state.sync() (mtxcomm's ranks are
    fixed: a failure is raised, never retried on a new set of workers)."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        state.sync()
        return func(state, *args, **kwargs)

    return wrapper
