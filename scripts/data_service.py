"""Start a tf.data service dispatcher or worker, for fine_tune.py --data-service.

    photoclf data-service dispatcher --port 5050
    photoclf data-service worker --dispatcher dispatcher-host:5050      # on each CPU machine

The same command as `photoclf data-service` (its --help says more).
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("data-service")
