"""What runs once, when ``keras`` is imported (:func:`_patch_keras`, called by ``_start``'s import
hook): mtxcomm is initialised (a collective), every rank takes one random seed drawn on rank 0,
and the hooks of the other modules are installed on Keras' classes, in this order: the hooks
that act inside a transparent step (``_step_hooks``), the iterators' release on a background
thread (``mtxcomm.tensorflow._keras_iterators``), ``Model.fit`` (``_fit``), ``train_on_batch``,
``test_on_batch``, ``evaluate`` and ``predict`` (``_evaluate``), and the saves (``_save``)."""

from ._evaluate import _wrap_evaluate_predict, _wrap_on_batch
from ._fit import _wrap_fit
from ._input import _unseeded
from ._save import _save_on_rank_0
from ._step_hooks import (
    _draw_apart,
    _record_state_assignments,
    _share_additional_losses,
    _synchronise_batch_norm,
    _weigh_batch_means,
)
from ._tf import tf_module


def _patch_keras(keras):
    import numpy as np

    import mtxcomm.tensorflow as mtx
    import mtxcomm.tensorflow.keras as hvd
    from mtxcomm.tensorflow import _keras_iterators as iterators

    mtx.init()
    # One seed for every rank, drawn on rank 0: identical shuffling and initialisation.
    seed = int(np.random.SeedSequence().generate_state(1)[0] % (2**31))
    seed = mtx.broadcast_object(seed, 0, name="mtxcomm.transparent.seed")
    keras.utils.set_random_seed(seed)
    _unseeded["seed"] = seed

    rank = mtx.rank()
    _synchronise_batch_norm(keras, hvd)
    _weigh_batch_means(keras, hvd)
    _share_additional_losses(keras, hvd)
    _record_state_assignments(keras, hvd)
    _draw_apart(keras, hvd)
    model_cls = keras.Model

    iterators.install(model_cls, tf_module())
    _wrap_fit(model_cls, keras, mtx, hvd, rank)
    _wrap_on_batch(model_cls, keras, hvd)
    _wrap_evaluate_predict(model_cls, keras, mtx, hvd, rank)
    _save_on_rank_0(keras, model_cls, rank, mtx)
