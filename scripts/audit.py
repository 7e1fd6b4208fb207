"""Audit a photo dataset before trusting a number: duplicates, leaks, likely wrong labels, outliers.

    photoclf audit photos/                                  # class folders (or train/ val/ [test/])
    photoclf audit photos.csv --write-manifest reviewed.csv # then edit it and convert it

The same command as `photoclf audit` (its --help says more).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("audit")
