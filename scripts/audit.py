"""Audit a photo dataset before trusting a number: duplicates, leaks, likely wrong labels, outliers.

    photoclf audit photos/                                  # class folders (or train/ val/ [test/])
    photoclf audit photos.csv --write-manifest reviewed.csv # then edit it and convert it
    photoclf audit data/                                    # a TFRecord folder from make_tfrecords.py

Writes REPORT/audit.json (every finding), REPORT/report.html (one self-contained page) and
REPORT/embeddings.npz (reused by the next audit of the same files), and prints a summary.
--write-manifest writes a CSV that make_tfrecords.py accepts: review it (flip labels, set
keep=false), then run make_tfrecords.py on it.
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("audit")
