"""Running an export on photos, apart from any HTTP: the runtimes (the SavedModel or its checked
LiteRT file), batch prediction over files, and Grad-CAM explanations. The server (app/serving),
evaluation, review and `photoclf predict` all use it."""
