"""The rest of Horovod's TensorFlow API in mtxcomm.tensorflow, checked against NumPy on every
rank: alltoall, the grouped allgather/reduce-scatter, in-place broadcast, the rank/size ops,
object collectives (eager and TF1 graph), the build queries, integer scaling, the error classes
Horovod raises, local gradient sources, the elastic state objects.

Run with 1, 2 and 3 ranks (tests/python/run_suite.sh), like test_ops.py.
"""

import numpy as np
import pytest
import tensorflow as tf
from conftest import launched_size, rank_values

SIZE = launched_size()
multi_rank = pytest.mark.skipif(SIZE < 2, reason="needs at least 2 ranks")

A2A_DTYPES = [
    tf.uint8,
    tf.int8,
    tf.int16,
    tf.uint16,
    tf.int32,
    tf.int64,
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.bool,
]


def wide(a):
    return np.asarray(a).astype(np.float64)


def rows_sent(src, dst):
    """Rows rank src sends to rank dst in the uneven alltoall tests: (src + 2 * dst) % 3."""
    return (src + 2 * dst) % 3


def a2a_block(src, dst, dtype, trailing):
    """The rows src sends to dst: values that say who sent them to whom."""
    n = rows_sent(src, dst)
    v = np.arange(n * int(np.prod(trailing)), dtype=np.int64).reshape((n,) + trailing)
    v = (v + 10 * src + dst) % (2 if dtype == tf.bool else 50)
    return v.astype(dtype.as_numpy_dtype)


# ---------------------------------------------------------------------------------------------
# alltoall


@pytest.mark.parametrize("dtype", A2A_DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("trailing", [(), (3,), (2, 2)], ids=["1d", "2d", "3d"])
def test_alltoall_uneven_splits(hvd, dtype, trailing):
    r = hvd.rank()
    blocks = [a2a_block(r, j, dtype, trailing) for j in range(SIZE)]
    x = tf.constant(np.concatenate(blocks, axis=0), dtype=dtype)
    splits = [rows_sent(r, j) for j in range(SIZE)]
    got, received = hvd.alltoall(x, splits=splits, name=f"a2a_{dtype.name}_{len(trailing)}")
    want = np.concatenate([a2a_block(i, r, dtype, trailing) for i in range(SIZE)], axis=0)
    assert got.dtype == dtype and received.dtype == tf.int32
    assert tuple(got.shape) == want.shape
    np.testing.assert_array_equal(wide(got.numpy()), wide(want))
    assert received.numpy().tolist() == [rows_sent(i, r) for i in range(SIZE)]


def test_alltoall_without_splits_sends_equal_shares(hvd):
    r = hvd.rank()
    x = tf.constant(np.arange(2 * SIZE, dtype=np.float32) + 100 * r)
    got = hvd.alltoall(x, name="a2a_even")
    assert not isinstance(got, tuple), "without splits alltoall returns one tensor"
    want = np.concatenate(
        [np.arange(2 * r, 2 * r + 2, dtype=np.float32) + 100 * i for i in range(SIZE)]
    )
    np.testing.assert_array_equal(got.numpy(), want)


def test_alltoall_inside_function_and_empty(hvd):
    @tf.function
    def f(x, s):
        return hvd.alltoall(x, splits=s, name="a2a_fn")

    x = tf.zeros([0, 4], tf.int32)
    got, received = f(x, tf.zeros([SIZE], tf.int32))
    assert tuple(got.shape) == (0, 4)
    assert received.numpy().tolist() == [0] * SIZE


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_alltoall_gradient_sends_rows_back(hvd, mode):
    # loss_k = sum(W_k * y_k): the gradient of a row is the weight its receiver gave it
    r = hvd.rank()
    x = tf.constant(np.ones([sum(rows_sent(r, j) for j in range(SIZE)), 2], np.float32))
    splits = [rows_sent(r, j) for j in range(SIZE)]
    recv_rows = sum(rows_sent(i, r) for i in range(SIZE))
    w = tf.constant(np.full([recv_rows, 2], r + 1, np.float32))

    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y, _ = hvd.alltoall(x, splits=splits, name=f"a2a_grad_{mode}")
            loss = tf.reduce_sum(w * y)
        return tape.gradient(loss, x)

    grad = (tf.function(run) if mode == "function" else run)(x)
    want = np.concatenate([np.full([rows_sent(r, j), 2], j + 1, np.float32) for j in range(SIZE)])
    np.testing.assert_array_equal(grad.numpy(), want)


def test_alltoall_bad_splits_raise_invalid_argument_on_every_rank(hvd):
    # every rank gets the verdict on rank 0's splits, so no rank is left waiting
    r = hvd.rank()
    splits = [1] * SIZE if r else [2] + [1] * (SIZE - 1)  # rank 0's sum to SIZE + 1
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        hvd.alltoall(tf.ones([SIZE]), splits=splits, name="a2a_bad").numpy()
    assert "rank 0 passed splits summing to" in str(e.value), str(e.value)
    # no splits: dimension 0 must be a multiple of size() (with one rank, a scalar has none)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        hvd.alltoall(
            tf.ones([SIZE + 1]) if SIZE > 1 else tf.constant(1.0), name="a2a_uneven"
        ).numpy()
    if SIZE > 1:
        assert "not a multiple of the number of ranks" in str(e.value), str(e.value)


# ---------------------------------------------------------------------------------------------
# grouped allgather / reduce-scatter


def test_grouped_allgather_mixed(hvd):
    r = hvd.rank()
    xs = [
        tf.constant(np.full([r + 1, 2], r, np.float32)),
        tf.constant([r, -r], tf.int64),
        tf.constant(np.array([r % 2 == 0]), tf.bool),
    ]
    got = hvd.grouped_allgather(xs, name="gag")
    want0 = np.concatenate([np.full([k + 1, 2], k, np.float32) for k in range(SIZE)])
    np.testing.assert_array_equal(got[0].numpy(), want0)
    assert got[1].numpy().tolist() == [v for k in range(SIZE) for v in (k, -k)]
    assert got[2].numpy().tolist() == [k % 2 == 0 for k in range(SIZE)]


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_grouped_reducescatter(hvd, op):
    r = hvd.rank()
    dim0 = 2 * SIZE + 1  # uneven: the first ranks get one more row
    xs = [
        tf.constant(rank_values((dim0, 3), np.float32, r)),
        tf.constant(rank_values((dim0,), np.int32, r, offset=2)),
    ]
    got = hvd.grouped_reducescatter(xs, op=getattr(hvd, op), name=f"grs_{op}")
    start = sum(dim0 // SIZE + (k < dim0 % SIZE) for k in range(r))
    rows = dim0 // SIZE + (r < dim0 % SIZE)
    for g, dtype, shape, offset in (
        (got[0], np.float32, (dim0, 3), 0),
        (got[1], np.int32, (dim0,), 2),
    ):
        total = sum(
            rank_values(shape, dtype, k, offset=offset).astype(np.int64) for k in range(SIZE)
        )
        if op == "Average":
            total = np.trunc(total / SIZE) if dtype == np.int32 else total / SIZE
        np.testing.assert_allclose(wide(g.numpy()), total[start : start + rows], rtol=1e-6)


def test_grouped_reducescatter_gradient(hvd):
    x = tf.constant(np.ones([2 * SIZE, 2], np.float32))
    with tf.GradientTape() as tape:
        tape.watch(x)
        ys = hvd.grouped_reducescatter([x, x * 2], op=hvd.Sum, name="grs_grad")
        loss = tf.reduce_sum(ys[0]) + tf.reduce_sum(ys[1])
    # Horovod's gradient of a Sum reduce-scatter: the gathered upstream gradient times size
    np.testing.assert_array_equal(
        tape.gradient(loss, x).numpy(), np.full([2 * SIZE, 2], 3 * SIZE, np.float32)
    )


def test_grouped_allgather_gradient_is_averaged(hvd):
    r = hvd.rank()
    x = tf.constant(np.ones([r + 1], np.float32))
    with tf.GradientTape() as tape:
        tape.watch(x)
        (y,) = hvd.grouped_allgather([x], name="gag_grad")
        loss = tf.reduce_sum(y * float(r + 1))
    want = (SIZE + 1) / 2.0  # mean over ranks of the weight (k + 1)
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), np.full([r + 1], want), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# in-place broadcast, rank/size ops, objects, build queries


@pytest.mark.parametrize("root", range(SIZE))
def test_broadcast_in_place(hvd, root):
    r = hvd.rank()
    vs = [
        tf.Variable(np.full([3], r, np.float32)),
        tf.Variable(np.array([r % 2 == 1])),
        tf.Variable(np.full([2, 2], r, np.int16)),
    ]
    out = hvd.broadcast_(vs, root, name=f"bc_inplace_{root}")
    np.testing.assert_array_equal(vs[0].numpy(), np.full([3], root, np.float32))
    assert vs[1].numpy().tolist() == [root % 2 == 1]
    np.testing.assert_array_equal(vs[2].numpy(), np.full([2, 2], root, np.int16))
    for o, v in zip(out, vs):
        np.testing.assert_array_equal(o.numpy(), v.numpy())


def test_rank_and_size_ops(hvd):
    @tf.function
    def f():
        return hvd.rank_op(), hvd.local_rank_op(), hvd.size_op(), hvd.local_size_op()

    got = [int(t) for t in f()]
    assert got == [hvd.rank(), hvd.local_rank(), hvd.size(), hvd.local_size()]


def test_allgather_object_and_broadcast_object(hvd):
    r = hvd.rank()
    obj = {"rank": r, "payload": list(range(r))}
    got = hvd.allgather_object(obj)
    assert got == [{"rank": k, "payload": list(range(k))} for k in range(SIZE)]
    root = SIZE - 1
    b = hvd.broadcast_object({"from": r} if r == root else None, root_rank=root)
    assert b == {"from": root}


def test_object_collectives_and_global_variables_in_a_tf1_graph(hvd):
    r = hvd.rank()
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable(np.full([2], r, np.float32), name="global_v")
        bcast = hvd.broadcast_global_variables(0)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(bcast)
            value = sess.run(v)
            objs = hvd.allgather_object(r * 10, session=sess)
            got = hvd.broadcast_object_fn(root_rank=0, session=sess)("zero" if r == 0 else None)
    np.testing.assert_array_equal(value, [0.0, 0.0])
    assert objs == [k * 10 for k in range(SIZE)]
    assert got == "zero"


def test_broadcast_global_variables_eagerly_is_a_runtime_error(hvd):
    with pytest.raises(RuntimeError, match="eager"):
        hvd.broadcast_global_variables(0)


def test_build_queries_are_truthful(hvd):
    import mtxcomm.tensorflow._library as lib

    assert hvd.mpi_built() == lib.engine.build_feature("mpi")
    # The package's libmtxcomm has CUDA and NCCL where nvcc and nccl.h were found at install.
    # nccl_built() is Horovod's: NCCL_VERSION_CODE of the NCCL loaded (2.13+), else 0.
    from mtxcomm import _core

    nccl = hvd.nccl_built()
    assert type(nccl) is int
    assert nccl == (_core.nccl_version() if lib.engine.build_feature("nccl") else 0)
    assert nccl == 0 or nccl >= 21300
    assert hvd.cuda_built() is bool(lib.engine.build_feature("cuda"))
    for q in (hvd.gloo_built, hvd.gloo_enabled, hvd.ccl_built, hvd.ddl_built, hvd.rocm_built):
        assert q() is False
    assert hvd.mpi_enabled() == hvd.mpi_built()  # the suite runs under mpirun
    with pytest.raises(ValueError, match="unknown build feature"):
        lib.engine.build_feature("gloo")
    assert hvd.is_homogeneous() is True
    assert hvd.util._executing_eagerly() is True and hvd._executing_eagerly() is True


# ---------------------------------------------------------------------------------------------
# scaling, error classes


@pytest.mark.parametrize(
    "dtype", [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64], ids=lambda d: d.name
)
def test_prescale_postscale_of_integers_in_float64(hvd, dtype):
    r = hvd.rank()
    x = tf.constant(np.arange(6) % 4 + r, dtype=dtype)
    pre = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.7, name=f"pre_{dtype.name}")
    post = hvd.allreduce(x, op=hvd.Sum, postscale_factor=0.7, name=f"post_{dtype.name}")
    per_rank = [np.trunc((np.arange(6) % 4 + k) * 0.7) for k in range(SIZE)]
    np.testing.assert_array_equal(wide(pre.numpy()), np.sum(per_rank, axis=0))
    total = np.sum([np.arange(6) % 4 + k for k in range(SIZE)], axis=0)
    np.testing.assert_array_equal(wide(post.numpy()), np.trunc(total * 0.7))
    assert pre.dtype == dtype and post.dtype == dtype


def test_scaling_indexed_slices_is_not_implemented(hvd):
    s = tf.IndexedSlices(tf.ones([1, 3]), tf.constant([0]))
    for kw in ({"prescale_factor": 0.5}, {"postscale_factor": 2.0}):
        with pytest.raises(NotImplementedError, match="IndexedSlices"):
            hvd.allreduce(s, op=hvd.Sum, **kw)


@multi_rank
@pytest.mark.parametrize("case", ["shape", "dtype", "root", "allgather_dims", "alltoall_dims"])
def test_disagreement_is_failed_precondition(hvd, case):
    r = hvd.rank()
    name = f"disagree_{case}"
    with pytest.raises(tf.errors.FailedPreconditionError) as e:
        if case == "shape":
            hvd.allreduce(tf.zeros([2 + r]), name=name).numpy()
        elif case == "dtype":
            hvd.allreduce(tf.zeros([2], tf.float32 if r else tf.int32), name=name).numpy()
        elif case == "root":
            hvd.broadcast(tf.zeros([2]), root_rank=r, name=name).numpy()
        elif case == "allgather_dims":
            hvd.allgather(tf.zeros([1, 2 + r]), name=name).numpy()
        else:
            hvd.alltoall(tf.zeros([SIZE, 1 + r]), name=name).numpy()
    assert name in str(e.value) and "disagree" in str(e.value), str(e.value)


# ---------------------------------------------------------------------------------------------
# local gradient sources, legacy optimizer, elastic state


def test_local_sources_keep_their_gradient_divided_by_size(hvd):
    r = hvd.rank()
    shared = tf.Variable(np.full([2], 1.0, np.float32))
    local = tf.Variable(np.full([2], 1.0, np.float32))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(shared * (r + 1.0)) + tf.reduce_sum(local * (r + 1.0))
    tape = hvd.DistributedGradientTape(tape)
    tape.register_local_source(local)
    g_shared, g_local = tape.gradient(loss, [shared, local])
    np.testing.assert_allclose(g_shared.numpy(), np.full([2], (SIZE + 1) / 2.0), rtol=1e-6)
    np.testing.assert_allclose(g_local.numpy(), np.full([2], (r + 1.0) / SIZE), rtol=1e-6)


def test_partial_distributed_gradient_tape_splits_local_and_global(hvd):
    import keras

    r = hvd.rank()
    dense_a = keras.layers.Dense(2, kernel_initializer=keras.initializers.Constant(r + 1.0))
    dense_b = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(1.0))
    x = tf.ones([1, 3])
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(dense_b(dense_a(x)))
    weights = dense_a.trainable_weights + dense_b.trainable_weights
    plain = tape.gradient(loss, weights)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[dense_a])
    local, glob = tape.get_local_and_global_gradients(loss, weights)
    assert [id(v) for v, _ in local] == [id(v) for v in dense_a.trainable_weights]
    for (_, g), p in zip(local, plain[:2]):
        np.testing.assert_allclose(g.numpy(), p.numpy() / SIZE, rtol=1e-6)
    # dense_b's kernel gradient is dense_a's output, (r + 1) * 3 per unit: averaged over ranks
    kernel_grad = dict((id(v), g) for v, g in glob)[id(dense_b.kernel)]
    np.testing.assert_allclose(
        kernel_grad.numpy(), np.full([2, 1], 3 * (SIZE + 1) / 2.0), rtol=1e-5
    )


def test_legacy_optimizer_averages_compute_gradients(hvd):
    r = hvd.rank()
    with tf.Graph().as_default():
        v = tf.compat.v1.Variable([0.0])
        loss = v * float(r + 1)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
        step = opt.apply_gradients(opt.compute_gradients(loss, [v]))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(step)
            got = sess.run(v)
    np.testing.assert_allclose(got, [-(SIZE + 1) / 2.0], rtol=1e-6)


def test_elastic_state_sync_commit_restore(hvd):
    r = hvd.rank()
    v = tf.Variable(np.full([2], r + 1.0, np.float32))
    state = hvd.elastic.TensorFlowState([v], epoch=10 + r, batch=r)
    state.sync()
    np.testing.assert_array_equal(v.numpy(), [1.0, 1.0])
    assert (state.epoch, state.batch) == (10, 0)
    v.assign([5.0, 5.0])
    state.epoch = 11
    state.restore()
    np.testing.assert_array_equal(v.numpy(), [1.0, 1.0])
    assert state.epoch == 10
    v.assign([7.0, 7.0])
    state.epoch = 12
    state.commit()
    v.assign([0.0, 0.0])
    state.restore()
    np.testing.assert_array_equal(v.numpy(), [7.0, 7.0])
    assert state.epoch == 12
    calls = []

    @hvd.elastic.run
    def train(s, k):
        calls.append((s.epoch, k))
        return k * 2

    assert train(state, 4) == 8 and calls == [(12, 4)]


def test_bool_reductions_are_logical_and_average_is_refused(hvd):
    r = hvd.rank()
    x = tf.constant([r == 0, True, False, r % 2 == 1])
    any_ = hvd.allreduce(x, op=hvd.Sum, name="bool_or")
    all_ = hvd.allreduce(x, op=hvd.Min, name="bool_and")
    assert any_.numpy().tolist() == [True, True, False, SIZE > 1]
    assert all_.numpy().tolist() == [SIZE == 1, True, False, False]
    with pytest.raises(tf.errors.InvalidArgumentError, match="bool"):
        hvd.allreduce(x, name="bool_avg").numpy()  # Average, the default
    # the refusal failed only that call: the engine goes on
    np.testing.assert_array_equal(
        hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="after_bool").numpy(), [SIZE, SIZE]
    )


@multi_rank
def test_a_second_request_of_a_name_in_flight_is_refused_not_mispaired(hvd):
    import threading
    import time

    r = hvd.rank()
    results = {}

    def call(key):
        try:
            results[key] = (
                hvd.allreduce(tf.constant([float(r + 1)]), op=hvd.Sum, name="dup").numpy().tolist()
            )
        except tf.errors.FailedPreconditionError as e:
            results[key] = e

    if r == 0:
        # Rank 0's first "dup" waits for the others; a second one meanwhile is refused at once.
        t = threading.Thread(target=call, args=("thread",))
        t.start()
        time.sleep(0.5)
        call("main")
        hvd.allreduce(tf.ones([1]), name="dup_sync").numpy()
        t.join()
        refused = [k for k, v in results.items() if isinstance(v, Exception)]
        assert len(refused) == 1, results
        assert "in flight" in str(results[refused[0]]), results
        (kept,) = [v for v in results.values() if not isinstance(v, Exception)]
    else:
        hvd.allreduce(tf.ones([1]), name="dup_sync").numpy()
        call("main")
        kept = results["main"]
    assert kept == [SIZE * (SIZE + 1) / 2.0]


def test_alltoall_splits_are_never_truncated(hvd):
    splits = tf.constant([2**32 + 1] + [0] * (SIZE - 1), tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="summing to 4294967297"):
        hvd.alltoall(tf.ones([1, 2]), splits=splits, name="a2a_int64").numpy()
    got, received = hvd.alltoall(
        tf.ones([SIZE, 2]), splits=tf.ones([SIZE], tf.int64), name="a2a_int64_ok"
    )
    assert tuple(got.shape) == (SIZE, 2) and received.numpy().tolist() == [1] * SIZE
    with pytest.raises(ValueError, match="integers"):
        hvd.alltoall(tf.ones([SIZE]), splits=[0.5] * SIZE)


def test_unpicklable_objects_raise_on_every_rank(hvd):
    r = hvd.rank()
    with pytest.raises(Exception) as e:
        hvd.broadcast_object((lambda: 1) if r == 0 else None, root_rank=0, name="unpickle_bc")
    if r != 0:
        assert isinstance(e.value, ValueError) and "root rank 0" in str(e.value)
    last = SIZE - 1
    with pytest.raises(Exception) as e:
        hvd.allgather_object((lambda: 2) if r == last else r, name="unpickle_ag")
    if r != last:
        assert isinstance(e.value, ValueError) and f"rank(s) {last}" in str(e.value)
    assert hvd.allgather_object(r, name="after_unpickle") == list(range(SIZE))
