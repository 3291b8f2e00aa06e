"""Plain Keras (no mtxcomm import) that starts a Python child importing Keras between two
fits, as a script running a helper tool or a data-loading worker would. The child must stay an
ordinary process (not transparent, no MPI start). Writes "CHILD <rc> <is transparent>" and
"DONE <rank>" to the file child.<rank> in the working directory (the ranks' stdout lines
interleave)."""

import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.utils.set_random_seed(1)
x = np.ones((8, 2), "float32")
model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, x[:, :1], batch_size=4, verbose=0)
child = subprocess.run(
    [sys.executable, "-c", "import sys, keras; print(int('mtxcomm.transparent' in sys.modules))"],
    capture_output=True,
    text=True,
    timeout=120,
)
rank = os.environ.get("OMPI_COMM_WORLD_RANK")
with open("child.%s" % rank, "w") as f:
    f.write("CHILD %d %s\n" % (child.returncode, child.stdout.strip() or child.stderr[-300:]))
    f.flush()
    model.fit(x, x[:, :1], batch_size=4, verbose=0)
    f.write("DONE %s\n" % rank)
