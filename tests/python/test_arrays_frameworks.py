"""The array API with PyTorch CPU tensors (when torch is importable), JAX CPU arrays (when jax
is), and one engine shared with mtxcomm.tensorflow. Run like test_arrays.py, in the same
session."""

import numpy as np
import pytest
from arrays_common import (
    BF16,
    RANK,
    SIZE,
    a2a_expected,
    a2a_input,
    a2a_splits,
    jax,
    needs_jax,
    needs_torch,
    rows_of,
    torch,
)
from conftest import assert_same, expected_reduce, rank_values, values

if jax is not None:
    import jax.numpy as jnp

# ---- PyTorch ---------------------------------------------------------------------------------

TORCH_DTYPES = [
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "bool",
]


def torch_values(shape, name, rank, offset=0):
    tdt = getattr(torch, name)
    if name == "bool":
        return torch.from_numpy(values(shape, np.bool_, rank, offset))
    base = rank_values(shape, np.int64, rank, offset)
    return torch.from_numpy(np.abs(base) if name.startswith("uint") else base).to(tdt)


def from_torch(t):
    """A torch tensor's values as NumPy (bfloat16 through float32, exact for these values)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(BF16) if BF16 is not None else t.float().numpy()
    return t.numpy()


@needs_torch
@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_allreduce_every_dtype(mc, name):
    if not hasattr(torch, name):
        pytest.skip("this torch has no %s" % name)
    op = "max" if name == "bool" else "sum"
    got = mc.allreduce(torch_values((3, 4), name, RANK), op=op)
    assert isinstance(got, torch.Tensor) and got.dtype == getattr(torch, name)
    want = expected_reduce(
        [from_torch(torch_values((3, 4), name, k)) for k in range(SIZE)],
        op,
        from_torch(torch_values((1,), name, 0)).dtype,
    )
    assert_same(from_torch(got), want)


@needs_torch
def test_torch_zero_copy_in_place_and_out(mc, core):
    t = torch_values((4, 5), "float32", RANK)
    got = mc.allreduce(t)
    engine_in, engine_out = core.last_buffers()
    inplace = torch_values((6,), "bfloat16", RANK)
    same = mc.allreduce(inplace, out=inplace)
    engine_in2, engine_out2 = core.last_buffers()
    out = torch.zeros(3, dtype=torch.int64)
    got_out = mc.broadcast(torch_values((3,), "int64", RANK), root=0, out=out)
    want = expected_reduce(
        [from_torch(torch_values((4, 5), "float32", k)) for k in range(SIZE)], "sum", np.float32
    )
    assert engine_in == t.data_ptr()
    assert engine_out == got.data_ptr()  # the result wraps the engine's buffer: no copy
    assert_same(got.numpy(), want)
    assert same is inplace and engine_in2 == engine_out2 == inplace.data_ptr()
    assert (
        from_torch(inplace).astype(np.float64).tolist()
        == expected_reduce(
            [from_torch(torch_values((6,), "bfloat16", k)) for k in range(SIZE)],
            "sum",
            from_torch(inplace).dtype,
        )
        .astype(np.float64)
        .tolist()
    )
    assert got_out is out and out.tolist() == torch_values((3,), "int64", 0).tolist()


@needs_torch
def test_torch_non_contiguous_grad_and_device_tensors(mc):
    base = torch_values((3, 4), "float64", RANK)
    got = mc.allreduce(base.t())  # non-contiguous: copied first
    leaf = torch.ones(2, requires_grad=True)
    got_grad = mc.allreduce(leaf)  # read through detach()
    want = expected_reduce(
        [from_torch(torch_values((3, 4), "float64", k)).T for k in range(SIZE)], "sum", np.float64
    )
    assert_same(got.numpy(), want)
    assert got_grad.tolist() == [float(SIZE)] * 2 and not got_grad.requires_grad
    with pytest.raises(ValueError, match="out requires grad"):
        mc.allreduce(leaf, out=leaf)
    with pytest.raises(ValueError, match="meta.*host \\(CPU\\) memory only"):
        mc.allreduce(torch.empty(3, device="meta"))
    with pytest.raises(TypeError, match="torch.complex64"):
        mc.allreduce(torch.zeros(2, dtype=torch.complex64))


@needs_torch
def test_torch_allgather_reduce_scatter_alltoall(mc):
    gathered = mc.allgather(torch_values((RANK + 1, 2), "float16", RANK))
    d0 = 2 * SIZE + 1
    scattered = mc.reduce_scatter(torch_values((d0, 2), "int32", RANK), op="min")
    x = torch.from_numpy(a2a_input(RANK, SIZE, np.int64))
    exchanged, received = mc.alltoall(x, splits=torch.tensor(a2a_splits(RANK, SIZE)))
    assert isinstance(gathered, torch.Tensor) and gathered.dtype == torch.float16
    assert_same(
        gathered.numpy(),
        np.concatenate([from_torch(torch_values((k + 1, 2), "float16", k)) for k in range(SIZE)]),
    )
    full = expected_reduce(
        [from_torch(torch_values((d0, 2), "int32", k)) for k in range(SIZE)], "min", np.int32
    )
    start = sum(rows_of(d0, SIZE, r) for r in range(RANK))
    assert_same(scattered.numpy(), full[start : start + rows_of(d0, SIZE, RANK)], "min")
    want, want_received = a2a_expected(RANK, SIZE, np.int64)
    assert isinstance(exchanged, torch.Tensor) and isinstance(received, torch.Tensor)
    assert_same(exchanged.numpy(), want)
    assert received.dtype == torch.int32 and received.tolist() == want_received


# ---- JAX -------------------------------------------------------------------------------------


@needs_jax
def test_jax_arrays(mc, core):
    x = jnp.asarray(values((4, 3), np.float32, RANK))
    got = mc.allreduce(x, op="max")
    engine_in, _ = core.last_buffers()
    b = jnp.asarray(values((5,), np.float32, RANK)).astype(jnp.bfloat16)
    got_b = mc.allreduce(b)
    gathered = mc.allgather(jnp.asarray(values((RANK + 1,), np.int32, RANK)))
    assert isinstance(got, jax.Array)
    assert engine_in == x.unsafe_buffer_pointer()  # read in place
    assert_same(
        np.asarray(got),
        expected_reduce([values((4, 3), np.float32, k) for k in range(SIZE)], "max", np.float32),
    )
    assert isinstance(got_b, jax.Array) and got_b.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(got_b, np.float64),
        expected_reduce([values((5,), np.float32, k) for k in range(SIZE)], "sum", np.float32),
    )
    assert_same(
        np.asarray(gathered), np.concatenate([values((k + 1,), np.int32, k) for k in range(SIZE)])
    )
    with pytest.raises(ValueError, match="JAX arrays are immutable"):
        mc.allreduce(x, out=x)


# ---- one engine with mtxcomm.tensorflow --------------------------------------------------------


def test_one_engine_and_communicator_with_mtxcomm_tensorflow(mc, core):
    if SIZE > 2:
        pytest.skip("run at np=1 and 2: importing TensorFlow costs about 10 s of CPU per rank")
    try:
        import tensorflow as tf

        import mtxcomm.tensorflow as hvd
    except Exception as e:  # noqa: BLE001
        pytest.skip("mtxcomm.tensorflow is not importable: %s: %s" % (type(e).__name__, e))
    assert hvd.is_initialized()  # started by mtxcomm.init()
    hvd.init()  # a no-op: the engine runs
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (
        mc.rank(),
        mc.size(),
        mc.local_rank(),
        mc.local_size(),
    )
    before = core.collective_count()
    tf_sum = hvd.allreduce(tf.constant([1.0, float(RANK)]), op=hvd.Sum, name="arrays.tf").numpy()
    np_sum = mc.allreduce(np.array([1.0, float(RANK)], np.float32))
    after = core.collective_count()
    with open("/proc/self/maps") as f:
        engines = {line.split()[-1] for line in f if "libmtxcomm_engine" in line}
    assert len(engines) == 1, engines
    assert after - before == 2  # both calls counted by the one engine
    assert hvd._collective_count() == after
    np.testing.assert_array_equal(tf_sum, np_sum)
    np.testing.assert_array_equal(np_sum, [float(SIZE), float(sum(range(SIZE)))])
