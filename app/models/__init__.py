"""Backbone registry and the classifier built around it."""
