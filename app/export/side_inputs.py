"""The serving signatures' side-feature inputs: one per column, named as in the CSV manifest.

A numeric column takes float32 [N] (NaN: missing); a categorical column takes its raw value as a
string [N], looked up in the training vocabulary inside the graph ("" or an unseen value: index
0, the missing category). `encode` turns them into the vector the model was trained on
(app/data/side_features.py), so a client sends the values it has, not their encoding.
"""

from __future__ import annotations

import tensorflow as tf

from app.data.side_features import MISSING_INDEX, NUMERIC


def column_specs(columns: list[dict]) -> list[tf.TensorSpec]:
    """One input per column: float32 [N] for a number, string [N] for a category."""
    return [tf.TensorSpec([None], tf.float32 if c["kind"] == NUMERIC else tf.string, name=c["name"]) for c in columns]


class SideInputs(tf.Module):
    def __init__(self, columns: list[dict]) -> None:
        super().__init__()
        self.columns = columns
        self.tables = [self._table(c) if c["kind"] != NUMERIC else None for c in columns]

    @staticmethod
    def _table(column: dict) -> tf.lookup.StaticHashTable:
        vocabulary = column["vocabulary"] or [""]  # a column with no value in training still gets a (dummy) table
        indices = [float(i + 1) for i in range(len(column["vocabulary"]))] or [float(MISSING_INDEX)]
        initializer = tf.lookup.KeyValueTensorInitializer(tf.constant(vocabulary), tf.constant(indices, tf.float32))
        return tf.lookup.StaticHashTable(initializer, default_value=float(MISSING_INDEX))

    def specs(self) -> list[tf.TensorSpec]:
        return column_specs(self.columns)

    def encode(self, values: tuple[tf.Tensor, ...]) -> tf.Tensor:
        """One tensor per column, in `columns` order → float32 [N, F]."""
        encoded = [
            value if table is None else table.lookup(tf.strings.strip(value))
            for value, table in zip(values, self.tables)
        ]
        return tf.stack(encoded, axis=-1)
