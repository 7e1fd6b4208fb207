"""Which backbone for your photos? Ranks candidates by a linear probe on their frozen features.

    photoclf compare-backbones data/ --backbones mobilenet_v2,efficientnet_lite0

The same command as `photoclf compare-backbones` (its --help says more).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("compare-backbones")
