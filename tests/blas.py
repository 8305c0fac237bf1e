"""OpenBLAS for the tests' generations, where they judge no timing.

On Linux, `mlx[cpu]`'s own BLAS makes the demo pair's generations ~3x slower than the
OpenBLAS the project already installs (cmeel-openblas, which the demo pair's training
preloads too; 40 tokens: 94 -> 32 ms). Preloading it changes no command and no check,
only how fast the nodes compute. `make test` preloads it for both its parts
(``python -m tests.blas`` prints the variables; the test sshd nodes pass them on, see
tests/fleet.py); the tests that opt out with ``default_blas`` (tests/conftest.py) keep the
default (the lineup ladder weighs its tiers' measured speeds). The `alone` tests judge
ratios and shares that hold at either speed (TTFT growth with streams, a CPU share beside
a hog, planted runtimes' stops). ``preloaded()`` gives it to the local agents of a test
run by other means (a plain ``pytest``).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from contextlib import contextmanager

import pytest

VARS = ("LD_PRELOAD", "OPENBLAS_NUM_THREADS")  # what the preload sets, and what sshd passes on


@functools.lru_cache(maxsize=1)
def openblas() -> dict[str, str]:
    """The variables that preload it (empty where there is none to preload, or where it
    does not run here)."""
    from orchestrator.demo_models.build import openblas_env

    env = openblas_env()
    if "LD_PRELOAD" not in env:
        return {}
    found = dict(zip(VARS, (env["LD_PRELOAD"], "1")))
    # The wheel's OpenBLAS is built for some CPUs only: on an AVX2-only AMD EPYC host an
    # mlx matmul under the preload dies of SIGILL (exit 132). Probe once; without it the
    # tests run the same checks on mlx's own, slower BLAS.
    probe = subprocess.run([sys.executable, "-c", "import mlx.core as mx; a = mx.ones((96, 96));"
                            " mx.eval(a @ a)"], env={**os.environ, **found},
                           capture_output=True, timeout=120)
    return found if probe.returncode == 0 else {}


@contextmanager
def preloaded():
    """Local agents started inside inherit the preload (they inherit os.environ); pytest's
    MonkeyPatch puts the variables back afterwards (usable in a module-scoped fixture)."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in openblas().items():
            mp.setenv(key, value)
        yield


if __name__ == "__main__":  # for `env $(python -m tests.blas) pytest …` in the Makefile
    print(" ".join(f"{k}={v}" for k, v in openblas().items()))
