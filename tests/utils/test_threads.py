"""OpenMP's wait settings: defaults set before torch loads, a user's own kept."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from speculant.utils.threads import SPINCOUNT, WAIT_POLICY, prepare_openmp


def test_defaults_fill_only_what_the_user_left_unset():
    env = {"OMP_WAIT_POLICY": "PASSIVE"}
    prepare_openmp(env, torch_loaded=False)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": SPINCOUNT}
    env = {}
    prepare_openmp(env, torch_loaded=False)
    assert env == {"OMP_WAIT_POLICY": WAIT_POLICY, "GOMP_SPINCOUNT": SPINCOUNT}


def test_torch_imported_first_is_told_unless_the_user_chose():
    with pytest.warns(RuntimeWarning, match="import speculant first or set OMP_WAIT_POLICY=ACTIVE"):
        prepare_openmp({}, torch_loaded=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepare_openmp({"OMP_WAIT_POLICY": "PASSIVE"}, torch_loaded=True)  # the user's own choice: no word


def test_importing_speculant_sets_them_before_torch_loads():
    script = (
        "import sys, os; import speculant; assert 'torch' in sys.modules;"
        "print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'])"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [WAIT_POLICY, SPINCOUNT]
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line]
    assert imported.index("speculant.utils.threads") < imported.index("torch")  # set before torch loads
