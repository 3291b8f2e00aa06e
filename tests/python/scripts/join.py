"""Uneven data: at np=3 the ranks have 10, 10 and 11 batches. Each allreduces (rank+1) * ones
per batch, then joins. Prints one JSON line per rank with every result, join()'s value and the
two broadcasts tried while ranks 0 and 1 have joined (rank 2 only)."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
from _report import report as emit  # noqa: E402

import mtxcomm.tensorflow as hvd  # noqa: E402

hvd.init()
r, n = hvd.rank(), hvd.size()
batches = 11 if r == n - 1 else 10
results = []
for _ in range(batches):
    out = hvd.allreduce(tf.fill([3], float(r + 1)), op=hvd.Sum, name="grad")
    results.append(float(out.numpy()[0]))
report = {"rank": r, "results": results}
if r == n - 1:
    # Ranks 0 and 1 have joined (they are inside join()): a broadcast from this rank works...
    got = hvd.broadcast(tf.constant([7.0, 8.0]), root_rank=r, name="from_active")
    report["broadcast_from_active"] = got.numpy().tolist()
    # ... one from a joined root cannot.
    try:
        hvd.broadcast(tf.constant([1.0]), root_rank=0, name="from_joined")
        report["broadcast_from_joined"] = "no error"
    except tf.errors.OpError as e:
        report["broadcast_from_joined"] = type(e).__name__ + ": " + e.message
report["last_joined"] = hvd.join()
# After the join every rank is active again.
report["after"] = float(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="after").numpy()[0])
emit("JOIN", json.dumps(report))
