"""Export a finished run as a TF Serving SavedModel (image bytes in), with its CPU runtimes' files.

    photoclf export runs/demo                        # → runs/demo/export/demo/<next version>

The same command as `photoclf export` (its --help says more).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("export")
