"""Label the unlabelled photos that would help the model most, on a local page.

    python scripts/review.py runs/photos ~/new_photos             # http://127.0.0.1:8502/

The same command as `photoclf review` (its --help says more).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("review")
