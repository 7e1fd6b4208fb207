"""app/__init__.py: TensorFlow keeps and reuses its CPU memory instead of faulting it in afresh
every step (the BFC allocator), unless the environment says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# 20 steps that each make and free a 64 MB tensor (larger than anything glibc's malloc keeps for
# reuse): the page faults they cost after the first, when the memory is allocated.
STEPS = """
import resource
import app
import tensorflow as tf

step = tf.function(lambda x: tf.reduce_sum(x * 2.0))
x = tf.ones([4096, 4096])
step(x).numpy()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step(x).numpy()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
FAULTS_PER_FRESH_64MB = 64 * 2**20 // 4096  # 16,384 pages of 4 KiB


def faults_over_20_steps(allocator_setting: str | None) -> int:
    """In a fresh interpreter whose environment has `allocator_setting` (None: nothing set)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}  # the tests' own import set it
    if allocator_setting is not None:
        env["TF_CPU_ALLOCATOR_USE_BFC"] = allocator_setting
    done = subprocess.run(
        [sys.executable, "-c", STEPS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1])


def kernel_counts_page_faults() -> bool:
    """Some sandboxes' kernels report no minor page faults at all (ru_minflt stays put while 64 MB
    are touched afresh): there the allocator's effect cannot be seen."""
    import resource

    import numpy as np

    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    np.ones(64 * 2**20, np.uint8).sum()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before > FAULTS_PER_FRESH_64MB // 2


@pytest.mark.slow  # two fresh interpreters, each importing TensorFlow
def test_importing_app_first_makes_tensorflow_reuse_its_memory_across_steps():
    if not kernel_counts_page_faults():
        pytest.skip("this kernel reports no minor page faults (ru_minflt), so reuse cannot be measured here")
    reused = faults_over_20_steps(None)
    refaulted = faults_over_20_steps("false")  # the user's word wins
    assert reused < FAULTS_PER_FRESH_64MB  # less than one fresh 64 MB tensor in 20 steps
    assert refaulted > 10 * FAULTS_PER_FRESH_64MB  # TensorFlow's default: most steps fault theirs in afresh
