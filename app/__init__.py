"""Transfer-learning image classification: folder → TFRecords → two-phase fine-tune → SavedModel."""

import os

__version__ = "0.1.0"

# TensorFlow's default CPU allocator gives every large tensor back to the OS when it is freed, so
# each step of a 224-px model faults its activations in again, page by page: a profile of a
# default run found much of a forward pass's CPU time spent in the kernel.
# Its BFC allocator keeps and reuses that memory. Read when TensorFlow makes its first CPU tensor,
# so it must be set before TensorFlow is imported: every script, the notebook and the tests import
# `app` first. An explicit TF_CPU_ALLOCATOR_USE_BFC=false in the environment still wins.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
