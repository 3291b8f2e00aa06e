"""What every collective of the Horovod-style API shares (``_allreduce.py``,
``_collectives.py``, ``_ops.py``): the reduction ops (``Sum``, ``Average``...), the submitter of
the global process set's calls, the check of a call's name, the grouping by dtype, the names of
two-step calls and the check for joined ranks. The rules the collectives follow are in
``_ops.py``'s docstring.
"""

import threading

import torch

from mtxcomm import _arrays, _core
from mtxcomm.torch import _handles, _tensors, _work, process_sets
from mtxcomm.torch.basics import need_init, rank, size

# Reduction ops, as horovod.torch names them (mtxcomm's op numbers).
Sum = _arrays.SUM
Average = _arrays.AVG
Adasum = _arrays.ADASUM
Min = _arrays.MIN
Max = _arrays.MAX
Product = _arrays.PROD

_submitter = _work.Submitter("hvd")
_INT32 = _tensors.code(torch.empty(0, dtype=torch.int32), "hvd")
_INT64 = _tensors.code(torch.empty(0, dtype=torch.int64), "hvd")


def _op_of(op, average, what):
    if average is not None:
        if op is not None:
            raise ValueError("mtxcomm.torch.%s: give op or average, not both" % what)
        return Average if average else Sum
    return Average if op is None else _arrays._op(op, what)


def _start(name, what, process_set):
    """The checks every call makes first; returns (the process set's communicator, or None for
    the global set (the engine); the key under which the call's name is in flight)."""
    need_init(what)
    comm = process_sets.communicator(process_set, what)
    key = None if name is None else name if comm is None else (comm.id, name)
    _handles.claim_name(key, what)
    return comm, key


def _by_dtype(bufs, name):
    """The requests of one call of several tensors: [(request name, indices of its tensors)],
    one request per dtype (in the order the dtypes first appear), named name (one dtype) or
    "name.K" (several; unnamed: the next auto names, in that order on every rank)."""
    groups = {}
    for i, b in enumerate(bufs):
        groups.setdefault(b.code, []).append(i)
    if len(groups) == 1:
        return [(name, list(range(len(bufs))))]
    return [
        (None if name is None else "%s.%d" % (name, k), idx)
        for k, idx in enumerate(groups.values())
    ]


def _submit_by_dtype(kind, ins, outs, name, what, op=_arrays.SUM):
    """Submits one request per dtype of ins (read) into outs (written); returns the pendings."""
    pendings = []
    for req, idx in _by_dtype(ins, name):
        pendings.append(
            _submitter.submit(
                kind,
                [ins[i].ptr() for i in idx],
                ins[idx[0]].code,
                [ins[i].dims() for i in idx],
                [outs[i].ptr() for i in idx],
                [outs[i].dims() for i in idx],
                op=op,
                name=req,
            )
        )
    return pendings


# ---- names of two-step calls, and the check for joined ranks -----------------------------------

_STEPS_WINDOW = 64
_steps_lock = threading.Lock()
_steps_seq = [0]
_steps_slots = [None] * _STEPS_WINDOW


def _two_step_names(name):
    """(first step's name, second step's name, slot) of a two-step call. A named call's steps
    are "NAME.sizes" and NAME; an unnamed call takes the next of 64 slots "hvd.steps.K" (the
    ranks make the same unnamed calls in the same order, so K agrees), first waiting for the
    call that had the slot 64 calls ago (a name is never in flight twice)."""
    if name is not None:
        return name + ".sizes", name, None
    with _steps_lock:
        slot = _steps_seq[0] % _STEPS_WINDOW
        _steps_seq[0] += 1
        previous = _steps_slots[slot]
    if previous is not None:
        try:
            previous.wait()
        except BaseException:  # noqa: BLE001 - its own synchronize raises it
            pass
    base = "hvd.steps.%d" % slot
    return base + ".sizes", base, slot


def _took_slot(slot, call):
    if slot is not None:
        with _steps_lock:
            _steps_slots[slot] = call


def _check_present(present, what):
    if present < size():
        raise _arrays.InvalidUsageError(
            "mtxcomm.torch.%s on rank %d: %d of %d ranks have joined (join()); as in Horovod, "
            "only allreduce runs while a rank has joined"
            % (what, rank(), size() - present, size()),
            2,
        )


def _presence(name, what):
    """Submits the allreduce that counts the ranks taking part in this call (a joined rank
    stands in with 0); returns (its Work, the check to run once the call is done)."""
    one = torch.ones(1, dtype=torch.int32)
    count = torch.empty(1, dtype=torch.int32)
    p = _submitter.submit(
        _core.KIND_ALLREDUCE,
        [one.data_ptr()],
        _INT32,
        [[1]],
        [count.data_ptr()],
        [[1]],
        op=Sum,
        name=None if name is None else name + ".present",
    )
    return (
        _submitter.work(what, [p], [count], (one, count)),
        lambda: _check_present(int(count[0]), what),
    )


# ---- allgather's two steps (sparse allreduce gathers too) ---------------------------------


def _gather_inputs(tensors, what):
    """The tensors to gather, detached and checked, scalars as one row."""
    out = []
    for tensor in tensors:
        _tensors.check(tensor, what)
        t = tensor.detach()
        out.append(t if t.dim() else t.reshape(1))
    return out


def _allgather_call(tensors, name, what, process_set):
    """One allgather of tensors (one request per dtype): a Call whose output is (the gathered
    tensors, the rows each rank gave, an int64 tensor [ranks, tensors])."""
    comm, key = _start(name, what, process_set)
    ts = _gather_inputs(tensors, what)
    bufs = [_tensors.Buf(t, what) for t in ts]
    if comm is not None:
        call = comm.allgather(ts, bufs, what, name)
        call.key = key
        return call
    n, k, r = size(), len(ts), rank()
    sizes_name, data_name, slot = _two_step_names(name)
    # The first step: every rank's dimension 0 of every tensor, and the count of the ranks
    # taking part (its last element; a joined rank stands in with zeros), by one allreduce.
    mine = torch.zeros(n * k + 1, dtype=torch.int64)
    mine[r * k : (r + 1) * k] = torch.tensor([t.shape[0] for t in ts], dtype=torch.int64)
    mine[-1] = 1
    summed = torch.empty_like(mine)
    p = _submitter.submit(
        _core.KIND_ALLREDUCE,
        [mine.data_ptr()],
        _INT64,
        [[n * k + 1]],
        [summed.data_ptr()],
        [[n * k + 1]],
        op=Sum,
        name=sizes_name,
    )
    sizes = _submitter.work(what, [p], [summed], (mine, summed))

    def then():
        _check_present(int(summed[-1]), what)
        rows = summed[:-1].reshape(n, k)
        totals = rows.sum(0).tolist()
        outs = [
            torch.empty((tot,) + tuple(t.shape[1:]), dtype=t.dtype) for tot, t in zip(totals, ts)
        ]
        obufs = [_tensors.Buf(o, what) for o in outs]
        ps = _submit_by_dtype(_core.KIND_ALLGATHER, bufs, obufs, data_name, what)
        return [_submitter.work(what, ps, outs, (bufs, obufs))], (outs, rows)

    call = _handles.Call([sizes], then=then)
    call.key = key
    _took_slot(slot, call)
    return call


def _gathered(call):
    return lambda _: call.output[0]


def allgather_async(tensor, name=None, process_set=None):
    """Concatenation of every rank's tensor along dimension 0 (first dimensions may differ;
    the others must agree), asynchronously; returns a handle."""
    call = _allgather_call([tensor], name, "allgather", process_set)
    return _handles.register(call, None, post=lambda _: call.output[0][0], name=call.key)


def grouped_allgather_async(tensors, name=None, process_set=None):
    """allgather of several tensors as one request (one per dtype); returns a handle whose result
    is the list of gathered tensors."""
    call = _allgather_call(list(tensors), name, "grouped_allgather", process_set)
    return _handles.register(call, None, post=_gathered(call), name=call.key)
