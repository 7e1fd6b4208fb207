"""Export a finished run as a TF Serving SavedModel (image bytes in) with its LiteRT file(s).

    photoclf export runs/demo                        # → runs/demo/export/demo/<next version>
    photoclf export runs/demo --export-dir /models --name shapes --tflite int8

TF Serving layout: EXPORT_DIR/NAME/VERSION/{saved_model.pb, variables/, assets/, litert/}. The
float32 LiteRT file (serve.py's fast CPU runtime) is checked against the SavedModel on the
validation split and the result stored in assets/metadata.json. Written to a hidden temp dir and
renamed when complete; an existing version is never overwritten.
"""

from app.commands import run_command

if __name__ == "__main__":
    run_command("export")
