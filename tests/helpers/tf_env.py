"""How a TensorFlow runner process is set up before it imports TensorFlow:
tf_runner.py applies it, and forked.py's zygote for tf_runner.py imports
with the same."""

from __future__ import annotations

import os
import sys

# one thread each: the runners are many, on 2 cores
ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "TF_CPP_MIN_LOG_LEVEL": "2"}
# TensorFlow imports JAX (tf.lite) and Keras imports scikit-learn (its
# wrappers) whenever they are installed, as here (the jax extra; the example's
# data): 1.5-2 of the 6 CPU-s each TensorFlow process here takes to import,
# for modules no case uses. None in sys.modules makes them absent to both.
ABSENT = ("jax", "sklearn")


def apply() -> None:
    for var, value in ENV.items():
        if var == "TF_CPP_MIN_LOG_LEVEL":
            os.environ.setdefault(var, value)  # a caller may want TensorFlow's logs
        else:
            os.environ[var] = value
    for name in ABSENT:
        sys.modules.setdefault(name, None)
