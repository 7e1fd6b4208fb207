"""Deployable artefacts: a TF Serving SavedModel that takes image bytes, and TFLite files."""
