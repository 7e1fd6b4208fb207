"""Serve an exported model over TF Serving's REST API, with an image-upload endpoint and a page.

    photoclf serve runs/demo/export/demo            # http://127.0.0.1:8501/ to try it

The same command as `photoclf serve` (its --help says more).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("serve")
