"""Every rank initialises, runs an allreduce and shuts down; then rank 0 exits while rank 1
initialises again: its init must fail within MTXCOMM_TIMEOUT naming the MPI setup step (it
used to wait in MPI_Comm_dup for rank 0 forever). Prints "REINIT_FAILED <seconds> <message>"
or "REINIT_RETURNED"."""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import mtxcomm.tensorflow as hvd  # noqa: E402

hvd.init()
rank = hvd.rank()
hvd.allreduce(tf.constant([1.0]), name="before")
hvd.shutdown()
if rank == 1:
    time.sleep(1)
    start = time.monotonic()
    try:
        hvd.init()
        print("REINIT_RETURNED", flush=True)
    except Exception as e:  # noqa: BLE001 (the message is what is checked)
        print(
            "REINIT_FAILED %.1f %s" % (time.monotonic() - start, " ".join(str(e).split())),
            flush=True,
        )
