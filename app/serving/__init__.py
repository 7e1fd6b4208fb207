"""Local HTTP server for exported SavedModels, speaking TF Serving's REST API."""
