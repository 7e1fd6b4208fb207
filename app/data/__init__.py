"""Data half of the project: TFRecord schema, writer, and the tf.data reading pipelines."""
