"""Combine the outputs of `make_tfrecords.py --num-writers N --writer-index i` into one dataset.json.

    photoclf merge data/

The same command as `photoclf merge` (its --help says more).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("merge")
