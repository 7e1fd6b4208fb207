"""Combine the outputs of `make_tfrecords.py --num-writers N --writer-index i` into one dataset.json.

    photoclf merge data/

Fails, writing nothing, unless every writer finished and every planned shard is present.
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("merge")
