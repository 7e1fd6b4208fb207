"""Convert a folder of photos (one subfolder per class) or a CSV manifest into sharded TFRecords.

    photoclf convert photos/ data/ --val-fraction 0.1 --test-fraction 0.1

The same command as `photoclf convert` (its --help says more).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("convert")
