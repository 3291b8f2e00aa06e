"""Transparent data parallelism for unmodified Keras 3 scripts (``mtxrun --transparent``).

``mtxrun --transparent`` starts every rank with ``MTXCOMM_TRANSPARENT=1`` and the ``mtxcomm``
package's ``_transparent`` folder first on ``PYTHONPATH``, whose ``sitecustomize`` calls
:func:`install` before the user's script runs. Nothing in the script changes. What is hooked:

- at interpreter start, on ranks other than 0: ``sys.stdout`` goes to /dev/null (progress bars,
  prints), unless ``MTXCOMM_TRANSPARENT_OUTPUT=all`` (``mtxrun --all-ranks-output``); stderr is
  kept on every rank;
- when ``keras`` is imported: mtxcomm is initialised (collective) and the global random seed is
  set to one value drawn on rank 0 (``keras.utils.set_random_seed``), so every rank shuffles
  identically; a seed the script sets later is used as it is, on every rank;
- ``keras.Model.fit``: the compiled optimizer becomes a DistributedOptimizer (gradients averaged
  over ranks, once per step); ``train_step`` is wrapped so that each rank computes on its
  contiguous 1/N share of every global batch (rows [B*r/N, B*(r+1)/N)) and weights its gradient
  by its share, so the average equals the full batch's gradient; model variables and optimizer
  state are broadcast from rank 0 when training begins; the epoch's training logs are combined
  over ranks weighted by the rows each trained on (the values a 1-process run reports);
  XLA compilation of the train step is turned off (the collective ops have no XLA kernel);
  on ranks other than 0, ``verbose`` is 0 and ModelCheckpoint, BackupAndRestore, TensorBoard
  and CSVLogger callbacks are dropped;
- input: a NumPy input (arrays, or lists/dicts of arrays) stays here and each rank gathers its
  own share of every global batch by row index in the train step; the batches of row indices
  come from one iterator for the whole fit (``_input._index_epochs``: the 1-process run's order
  under the script's seed, a new permutation every epoch without one), or from Keras' own
  batching and shuffling of an array of row indices where that order cannot be reproduced; a
  ``tf.data``
  dataset is mapped so that each rank keeps only its rows of every global batch (the rebatch of
  Keras' distribution code; what the pipeline computes before batching still runs on every
  rank, as with TensorFlow's own DATA sharding); other inputs (generators, PyDataset) are cut
  in the train step;
- ``keras.Model.evaluate`` / ``predict`` are distributed too: each rank computes on its rows
  of every batch; evaluate sums the metrics' state over the ranks (as tf.distribute does) so
  the results are the 1-process ones; predict gathers every batch's outputs in rank order, so
  they come back in the input's order on every rank; ``verbose=0`` on ranks other than 0;
- ``keras.Model.save``, ``save_weights`` and ``keras.saving.save_model``: write on rank 0 only;
- the tf.data iterator of each finished epoch (and of each ``evaluate``) is destroyed on a
  background thread, not on the training thread at the start of the next epoch: with one core
  per rank that destruction left the rank idle for 110-180 ms per epoch (see
  ``mtxcomm/tensorflow/_keras_iterators.py``);
- when training starts, once: a full garbage collection, then ``gc.freeze()`` (the ranks wait for
  each other every step: a collection walking every imported object on one rank stalls all).

Limits: a custom training loop with ``tf.GradientTape`` needs ``mtxcomm.tensorflow``
explicitly; the batch size stays the global batch; SparseTensor inputs are not split; with
``class_weight`` a NumPy input is cut in the train step (Keras needs the labels in its
pipeline).

Where each part lives (this file only re-exports :func:`install`):

- ``_start``: interpreter start: :func:`install`, the standard output of ranks other than 0,
  the import hook that patches Keras once it is imported;
- ``_keras_import``: when ``keras`` is imported: mtxcomm initialised, the seed drawn on rank 0,
  the hooks of the modules below installed;
- ``_fit``: ``keras.Model.fit``, and the garbage collector frozen when training starts;
- ``_callbacks``: the callbacks fit adds (logs weighted by rows, a check that the ranks hold the
  same weights, the start from rank 0's state, the ranks stopping together);
- ``_data_parallel``: the model's optimizers made distributed and its train, test and predict
  steps run on this rank's share of every batch; the metrics' results from the ranks' summed
  states;
- ``_step_hooks``: the Keras methods that act differently inside a transparent step (``Mean``
  metrics, additional losses, assignments to non-trainable weights, random draws,
  BatchNormalization's moments), and ``_variables``, reading a model's weights for them;
- ``_input`` and ``_share``: fit's input sharded; a rank's rows of a global batch;
- ``_evaluate``: ``evaluate``, ``predict``, ``train_on_batch`` and ``test_on_batch``;
- ``_save``: saves on rank 0 only;
- ``_checks``: the ranks' data compared, and stall verdicts given their usual cause;
- ``_tf``: TensorFlow, imported where first used.
"""

from ._start import install

__all__ = ["install"]
