"""Transfer-learning image classification: folder → TFRecords → two-phase fine-tune → SavedModel."""

import os
import sys

__version__ = "0.1.0"

# TensorFlow's default CPU allocator gives every large tensor back to the OS when it is freed, so
# each step of a 224-px model faults its activations in again, page by page: a profile of a
# default run found much of a forward pass's CPU time spent in the kernel.
# Its BFC allocator keeps and reuses that memory. Read when TensorFlow makes its first CPU tensor,
# so it must be set before TensorFlow is imported: every script, the notebook and the tests import
# `app` first. An explicit TF_CPU_ALLOCATOR_USE_BFC=false in the environment still wins.
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

# OpenVINO's model converter sends usage telemetry unless told not to, each event from a process
# it forks in the background. Forked from a process running TensorFlow's threads, such a child can
# wait forever on a lock that was held at the fork, and the command waits for it at exit: a
# two-worker training run hung after its export, its child stuck in `getaddrinfo`. Where the
# telemetry package cannot be imported, OpenVINO falls back to its own stub, which sends nothing
# and forks nothing: hidden here, before anything imports OpenVINO.
sys.modules.setdefault("openvino_telemetry", None)
