"""model_forms.py's setup, shared with the modules of its forms: the seeds, the rows' generator
and the form asked for (sys.argv[2])."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.utils.set_random_seed(1)
rng = np.random.default_rng(0)
form = sys.argv[2]
