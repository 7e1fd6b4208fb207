"""The name that marks a TFRecord folder, importable without TensorFlow: commands refuse a
TFRecord folder given where photos are asked for before the seconds of that import."""

METADATA_FILE = "dataset.json"
