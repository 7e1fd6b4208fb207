"""Transfer-learning image classification: folder → TFRecords → two-phase fine-tune → SavedModel."""

__version__ = "0.1.0"
