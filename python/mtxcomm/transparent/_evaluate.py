"""``keras.Model.evaluate`` and ``predict`` made data-parallel (each rank computes on its rows of
every batch, in the steps of ``_data_parallel``: evaluate sums the metrics' state over the ranks,
predict gathers every batch's outputs in rank order; ``verbose=0`` on ranks other than 0), and
``train_on_batch`` / ``test_on_batch``, which return the whole batch's logs."""

import functools
import inspect

from ._checks import _same_data_everywhere, _stall_hint
from ._data_parallel import _make_data_parallel
from ._tf import tf_module


def _wrap_on_batch(model_cls, keras, hvd):
    """Replaces model_cls.train_on_batch and test_on_batch: each rank computes on its share of
    the batch; the logs returned are the whole batch's."""
    for name in ("train_on_batch", "test_on_batch"):
        original = getattr(model_cls, name)
        sig = inspect.signature(original)

        def on_batch(original=original, sig=sig, name=name):
            @functools.wraps(original)
            def method(self, *args, **kwargs):
                bound = sig.bind(self, *args, **kwargs)
                _make_data_parallel(self, keras, hvd)
                # The batch itself, not row indices: a train step traced by fit for another
                # kind of input (NumPy rows as indices, a sharded dataset) is traced again.
                if name == "train_on_batch" and getattr(self, "_mtx_input", "step") != "step":
                    self._mtx_input = "step"
                    self.train_function = None
                as_dict = bound.arguments.get("return_dict", False)
                bound.arguments["return_dict"] = True
                logs = original(*bound.args, **bound.kwargs)
                # The whole batch's values, not this rank's share's, as Python floats (what
                # Keras returns: its own conversion ran on this rank's values).
                logs = _python_logs(self._get_metrics_result_or_logs(logs))
                return logs if as_dict else self._flatten_metrics_in_order(logs)

            return method

        setattr(model_cls, name, on_batch())


def _wrap_evaluate_predict(model_cls, keras, mtx, hvd, rank):
    """Replaces model_cls.evaluate and predict by their data-parallel forms (see the module
    docstring)."""
    from mtxcomm.tensorflow import _keras_iterators as iterators

    for name in ("evaluate", "predict"):
        original = getattr(model_cls, name)
        sig = inspect.signature(original)

        def distributed(original=original, sig=sig, name=name):
            @functools.wraps(original)
            def method(self, *args, **kwargs):
                bound = sig.bind(self, *args, **kwargs)
                if rank != 0:
                    bound.arguments["verbose"] = 0
                if not bound.arguments.get("kwargs", {}).get("_use_cached_eval_dataset"):
                    # (Not fit's own validation: fit compared those arrays.)
                    _same_data_everywhere(name, bound.arguments, ("x", "y", "sample_weight"), mtx)
                _make_data_parallel(self, keras, hvd)
                try:
                    return original(*bound.args, **bound.kwargs)
                except tf_module().errors.DeadlineExceededError as e:
                    raise _stall_hint(e) from e
                finally:
                    if name == "evaluate":
                        # (Only evaluate's own: fit's is still in use when fit validates.)
                        iterators.release_held(self, ("test_function",))

            return method

        setattr(model_cls, name, distributed())


def _python_logs(logs):
    """Keras' pythonify_logs: nested dicts flattened, scalar values as Python floats."""
    from keras.src.utils.python_utils import pythonify_logs

    return pythonify_logs(logs)
