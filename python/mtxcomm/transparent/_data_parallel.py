"""The model made data-parallel (:func:`_make_data_parallel`, at every fit, train_on_batch,
test_on_batch, evaluate and predict): its optimizers become DistributedOptimizers (gradients
averaged over the ranks); once per model, its train, test and predict steps run on this rank's
share of every global batch (:class:`_DataParallelSteps`), weighting its gradient by that
share and combining over the ranks the non-trainable weights the step assigned, predict
gathering the whole batch's outputs; and the logs of fit's epoch and of evaluate are computed
from the sum of the ranks' metric states."""

from ._share import _rows, _share, _take
from ._tf import tf_module
from ._variables import _layers, _own_state, _variable_value


def _model_optimizers(model, keras):
    """The compiled optimizer (an uncompiled model has none) and every other Keras optimizer
    the model or one of its sub-models holds, each once: as an attribute (a GAN's, which
    keras.io's compile(d_optimizer, g_optimizer) keeps so and its train_step applies), in a
    list, tuple or dict attribute, or as a sub-model's compiled optimizer."""
    found = []

    def visit(value, depth=0):
        if isinstance(value, keras.optimizers.Optimizer):
            if not any(value is f for f in found):
                found.append(value)
        elif depth < 2 and isinstance(value, (list, tuple, dict)):
            for item in value.values() if isinstance(value, dict) else value:
                visit(item, depth + 1)

    for m in [m for m in _layers(model) if isinstance(m, keras.Model)]:
        visit(getattr(m, "optimizer", None))
        for value in vars(m).values():
            visit(value)
    return found


def _make_data_parallel(model, keras, hvd):
    """At every fit, train_on_batch, test_on_batch, evaluate and predict: the model's optimizers
    become DistributedOptimizers (_model_optimizers; changed in place); at the first, its XLA
    compilation is turned off (the collective ops have no XLA kernel) and its steps and its
    metrics' results are replaced by a _DataParallelSteps's."""
    for optimizer in _model_optimizers(model, keras):
        hvd.DistributedOptimizer(optimizer)
    if getattr(model, "_mtx_sharded", False):
        return
    if getattr(model, "jit_compile", False):
        model.jit_compile = False
    _DataParallelSteps(model, keras, hvd).install()


class _DataParallelSteps:
    """One model's train, test and predict steps, each run on this rank's share of every global
    batch, and its metrics' results (Keras' _get_metrics_result_or_logs) computed from the sum of
    the ranks' metric states; install() puts them in the model's place. The steps take the
    input fit chose (model._mtx_input: _input) and tell the hooks of _step_hooks this rank's
    share through hvd._step_state, for the time of the step."""

    def __init__(self, model, keras, hvd):
        tf = tf_module()
        self.model = model
        self.keras = keras
        self.hvd = hvd
        self.original_step = model.train_step
        self.original_test = model.test_step
        self.original_predict = model.predict_step
        self.n, self.r = hvd.size(), hvd.rank()
        # Rows this rank trained on in the epoch: the weight of its logs (its share of each
        # batch can be uneven).
        self.rows = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        # How many traced steps named their collectives so far (combined_state, predict_step).
        self.traced_states = 0
        self.traced_predicts = 0

    def install(self):
        """The model's steps and _get_metrics_result_or_logs become this object's methods; its
        functions traced for the steps before are dropped."""
        model = self.model
        object.__setattr__(model, "_mtx_size", self.n)
        object.__setattr__(model, "_mtx_rank", self.r)
        object.__setattr__(model, "_mtx_input", "step")
        # A plain attribute, not a Keras-tracked variable: never saved with the model.
        object.__setattr__(model, "_mtx_rows", self.rows)
        model.train_step = self.train_step
        model.test_step = self.test_step
        model.predict_step = self.predict_step
        object.__setattr__(model, "_get_metrics_result_or_logs", self.summed_results)
        model._mtx_sharded = True
        model.train_function = None
        model.test_function = None
        model.predict_function = None

    def local_batch(self, data):
        """(this rank's rows of the global batch, its row count, the global batch's rows)."""
        tf = tf_module()
        mode = getattr(self.model, "_mtx_input", "step")
        if mode == "dataset":
            # The pipeline kept this rank's rows (an empty share: one row, weighted 0).
            local, batch = data
            _, _, count = _share(batch, self.n, self.r)
            return local, count, batch
        if mode == "indices":
            index = tf.nest.flatten(data)[0]
            batch = tf.shape(index, out_type=tf.int64)[0]
            start, end, count = _share(batch, self.n, self.r)
            mine = index[start:end]
            local = tf.nest.map_structure(
                lambda a: None if a is None else tf.gather(a, mine), self.model._mtx_arrays
            )
            # As Keras packs a batch (keras.utils.pack_x_y_sample_weight): x alone is handed
            # to the train step as itself, not as a tuple of one.
            return self.keras.utils.pack_x_y_sample_weight(*local), count, batch
        batch = _rows(data)
        start, end, count = _share(batch, self.n, self.r)
        return _take(data, start, end), count, batch

    def unchanged_metrics(self, count, step):
        """Runs step; a rank with no rows of this batch trained on one row weighted 0: its
        metrics (loss tracker included) must not count that row, they are put back after."""
        tf = tf_module()
        metric_vars = [v for m in self.model.metrics for v in m.variables]
        before = [tf.identity(v.value if hasattr(v, "value") else v) for v in metric_vars]
        logs = step()

        def restore():
            for v, b in zip(metric_vars, before):
                v.assign(b)
            return tf.constant(True)

        tf.cond(count > 0, lambda: tf.constant(False), restore)
        return logs

    def sharing(self, data, count, batch, step):
        """Runs step with hvd._step_state telling the Mean metrics this rank's share of the
        batch and whether the loss is summed over the rows (_weigh_batch_means)."""
        tf = tf_module()
        hvd = self.hvd
        flat = [t for t in tf.nest.flatten(data) if t is not None]
        hvd._step_state.model = self.model
        hvd._step_state.row_share = tf.cast(count, tf.float32) / tf.cast(batch, tf.float32)
        hvd._step_state.static_batch = flat[0].shape[0] if flat and flat[0].shape.rank else None
        hvd._step_state.summed_loss = _loss_is_summed(self.model, self.keras)
        hvd._step_state.seed_rank = self.r
        try:
            return self.unchanged_metrics(count, step)
        finally:
            hvd._step_state.seed_rank = 0
            hvd._step_state.row_share = None
            hvd._step_state.model = None
            hvd._step_state.summed_loss = False

    def train_step(self, data):
        """The model's train step on this rank's rows of the global batch (local_batch), with
        hvd._step_state telling the step its gradient's weight (grad_scale) and the row weight
        of BatchNormalization's global moments (row_weight)."""
        tf = tf_module()
        hvd = self.hvd
        local, count, batch = self.local_batch(data)
        self.rows.assign_add(tf.cast(count, tf.float64))
        if _loss_is_summed(self.model, self.keras):
            # The batch's gradient is the sum of the ranks': n times their average (a rank
            # with no rows of this batch trained on one row weighted 0: none of its gradient).
            hvd._step_state.grad_scale = tf.cast(count > 0, tf.float32) * tf.constant(
                float(self.n), tf.float32
            )
        else:
            # A mean over the rows: this rank's gradient weighted by its share of them.
            hvd._step_state.grad_scale = tf.cast(count * self.n, tf.float32) / tf.cast(
                batch, tf.float32
            )
        hvd._step_state.row_weight = tf.cast(count > 0, tf.float32)
        try:
            return self.sharing(
                data,
                count,
                batch,
                lambda: self.combining_state(count, batch, lambda: self.original_step(local)),
            )
        finally:
            hvd._step_state.grad_scale = None
            hvd._step_state.row_weight = None

    def combining_state(self, count, batch, step):
        """step(), then combined_state over the non-trainable weights it assigned."""
        tf = tf_module()
        hvd = self.hvd
        hvd._step_state.state_candidates = _own_state(self.model, self.keras)
        hvd._step_state.state_graph = (
            None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        )
        hvd._step_state.state_before = {}
        try:
            return self.combined_state(step(), count, batch)
        finally:
            hvd._step_state.state_before = None
            hvd._step_state.state_candidates = None
            hvd._step_state.state_graph = None

    def combined_state(self, out, count, batch):
        """After a step (train, test or predict): the model's non-trainable weights that the
        step assigned (a moving statistic of a custom layer, kept as Keras keeps
        BatchNormalization's, a counter), each set to its value before the step plus the sum
        of the ranks' changes to it, the same on every rank, as tf.distribute combines a
        variable by its aggregation: "sum" the changes summed, "only_first_replica" rank 0's,
        any other ("none", "mean") weighted by each rank's share of the batch's rows, so that
        a change linear in the batch (a moving mean of its rows) is the 1-process run's and a
        change every rank made alike (a counter) is that change. In float64 (an integer
        weight's rounded back). Without it each rank would keep its own share's statistics:
        the ranks' models drift apart, evaluate and predict mix them, rank 0 saves its own."""
        import numpy as np

        tf = tf_module()
        hvd = self.hvd
        assigned = list((hvd._step_state.state_before or {}).values())
        hvd._step_state.state_before = None  # (the assignments below are not the step's)
        if not assigned:
            return out
        # (A rank with no rows of this batch ran on one row weighted 0: none of its change.)
        rows = tf.cast(count > 0, tf.float64)
        weights = {"sum": rows, "only_first_replica": rows * (1.0 if self.r == 0 else 0.0)}
        share = tf.cast(count, tf.float64) / tf.cast(batch, tf.float64)
        changes = [
            tf.reshape(
                (tf.cast(_variable_value(v), tf.float64) - tf.cast(before, tf.float64))
                * weights.get(getattr(v, "aggregation", "none"), share),
                [-1],
            )
            for v, before in assigned
        ]
        # One tensor, whatever the number of weights. Each traced step names its own
        # (steps_per_execution > 1 traces several into one graph); the ranks trace alike. An
        # eager step (run_eagerly) reuses one name: a new one per step would never be cached.
        k = self.traced_states
        if not tf.executing_eagerly():
            self.traced_states += 1
        summed = hvd.allreduce(
            tf.concat(changes, 0), op=hvd.Sum, name="mtxcomm.transparent.state/%d" % k
        )
        sizes = [int(np.prod(before.shape)) for _, before in assigned]
        for (v, before), change in zip(assigned, tf.split(summed, sizes)):
            value = tf.cast(before, tf.float64) + tf.reshape(change, tf.shape(before))
            if before.dtype.is_integer:
                value = tf.round(value)
            v.assign(tf.cast(value, before.dtype))
        return out

    def test_step(self, data):
        """The model's test step on this rank's rows of the global batch."""
        batch = _rows(data)
        start, end, count = _share(batch, self.n, self.r)
        return self.sharing(
            data,
            count,
            batch,
            lambda: self.combining_state(
                count, batch, lambda: self.original_test(_take(data, start, end))
            ),
        )

    def predict_step(self, data):
        """The model's predict step on this rank's rows of the global batch; returns the whole
        batch's outputs."""
        tf = tf_module()
        batch = _rows(data)
        start, end, count = _share(batch, self.n, self.r)
        out = self.combining_state(
            count, batch, lambda: self.original_predict(_take(data, start, end))
        )
        # Every rank gets the whole batch's outputs, in rank order: the input's order. Each
        # traced step names its allgathers apart (steps_per_execution > 1 traces several steps
        # into one graph, whose collectives are in flight together); the ranks trace alike.
        # Eagerly (run_eagerly) one name serves every step: a new one would never be cached.
        k = self.traced_predicts
        if not tf.executing_eagerly():
            self.traced_predicts += 1
        flat = tf.nest.flatten(out)
        gathered = [
            self.hvd.allgather(t[:count], name="mtxcomm.transparent.predict/%d/%d" % (k, i))
            for i, t in enumerate(flat)
        ]
        return tf.nest.pack_sequence_as(out, gathered)

    def summed_results(self, logs):
        """Keras' _get_metrics_result_or_logs (the logs of fit's epoch and of evaluate) with
        every metric's result computed from the sum of the ranks' metric states: each rank's
        state covers its rows, their sum is the state of the whole data (tf.distribute's SUM
        aggregation of metric variables), so a ratio (AUC, precision, F1), a weighted metric
        or a mean is the 1-process value. Each rank's own state is put back afterwards (a
        train_on_batch with reset_metrics=False goes on accumulating its own rows). A collective:
        every rank calls it at the same points."""
        tf = tf_module()
        model = self.model
        variables = [v for m in model.metrics for v in m.variables]
        own = [tf.identity(tf.convert_to_tensor(v)) for v in variables]
        own_results = tf.nest.map_structure(tf.identity, model.get_metrics_result())
        if variables:
            for v, t in zip(variables, _combined_states(variables, own, self.hvd, tf)):
                v.assign(t)
        try:
            # Read now: a result() may return a state variable itself, which is put back below.
            metric_logs = tf.nest.map_structure(tf.identity, model.get_metrics_result())
        finally:
            for v, t in zip(variables, own):
                v.assign(t)
        if not isinstance(logs, dict):
            object.__setattr__(model, "_mtx_logs_combined", False)
            return logs
        if set(logs) == set(metric_logs):  # Keras' own rule: the metrics' results
            object.__setattr__(model, "_mtx_logs_combined", True)
            return metric_logs
        # A custom train_step or test_step's logs: a value that is a metric's result on this
        # rank (its own tracker's) takes that metric's combined result; a value of its own (a
        # batch's loss) stays, and fit's epoch combines those (_RowWeightedLogs). Nested dicts
        # too: keras.io's custom steps return {m.name: m.result() for m in self.metrics}, where
        # the compiled metrics' result is a dict of theirs (Keras flattens it afterwards).
        left_own = []

        def combined(d):
            out = {}
            for k, v in d.items():
                if isinstance(v, dict):
                    out[k] = combined(v)
                elif k in metric_logs and _same_value(v, own_results.get(k)):
                    out[k] = metric_logs[k]
                else:
                    out[k] = v
                    left_own.append(k)
            return out

        out = combined(logs)
        object.__setattr__(model, "_mtx_logs_combined", not left_own)
        return out


def _same_value(a, b):
    """Whether two log values (tensors, arrays or numbers) are equal, element for element."""
    import numpy as np

    if a is None or b is None:
        return False
    try:
        a, b = np.asarray(a), np.asarray(b)
        return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))
    except (TypeError, ValueError):
        return False


_warned_mixed_reductions = set()


def _loss_is_summed(model, keras):
    """Whether the compiled loss sums over the rows (every loss object given to compile has
    reduction "sum"): a rank's gradient and loss then cover its share's sum, not its mean.
    Losses of mixed reductions are taken as means, with one warning per model."""
    losses = [x for x in tf_module().nest.flatten(getattr(model, "loss", None)) if x is not None]
    if not losses:
        return False
    summed = [
        isinstance(x, keras.losses.Loss) and getattr(x, "reduction", None) == "sum" for x in losses
    ]
    if all(summed):
        return True
    if any(summed) and id(model) not in _warned_mixed_reductions:
        _warned_mixed_reductions.add(id(model))
        import sys

        print(
            "[mtxcomm rank %d] WARN transparent: the compiled losses mix reduction 'sum' with "
            "means; every rank's gradient is weighted as a mean over its rows, so the summed "
            "ones do not follow the 1-process run" % model._mtx_rank,
            file=sys.stderr,
            flush=True,
        )
    return False


def _combined_states(variables, values, hvd, tf):
    """The ranks' metric states combined by each variable's aggregation, as tf.distribute
    combines a metric's variables: "sum" (Keras' default for metric variables) and anything
    unknown summed, "mean" averaged, "only_first_replica" rank 0's. One grouped allreduce per
    kind present; every rank calls it with the same metrics."""
    kinds = [getattr(v, "aggregation", "sum") for v in variables]
    out = list(values)
    groups = (
        ("mean", hvd.Average, lambda t: t),
        ("only_first_replica", hvd.Sum, lambda t: t if hvd.rank() == 0 else tf.zeros_like(t)),
    )
    for kind, op, mine in groups:
        idx = [i for i, k in enumerate(kinds) if k == kind]
        if idx:
            reduced = hvd.grouped_allreduce(
                [mine(values[i]) for i in idx], op=op, name="mtxcomm.transparent.metrics/" + kind
            )
            for i, t in zip(idx, reduced):
                out[i] = t
    idx = [i for i, k in enumerate(kinds) if k not in ("mean", "only_first_replica")]
    if idx:
        reduced = hvd.grouped_allreduce(
            [values[i] for i in idx], op=hvd.Sum, name="mtxcomm.transparent.metrics"
        )
        for i, t in zip(idx, reduced):
            out[i] = t
    return out
