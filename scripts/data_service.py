"""Start a tf.data service server: one dispatcher, and any number of workers that decode and
augment training input for scripts/fine_tune.py --data-service grpc://DISPATCHER_HOST:PORT.

    photoclf data-service dispatcher --port 5050
    photoclf data-service worker --dispatcher dispatcher-host:5050      # on each CPU machine

Workers read the TFRecords themselves, so the data must be at the same path for them as for the
trainer (shared storage or gs://). Runs until Ctrl-C or SIGTERM.
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("data-service")
