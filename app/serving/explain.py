"""`photoclf predict --explain DIR`: a Grad-CAM map (app.models.gradcam) of each photo's top class,
as an overlay PNG and the map itself (float32 .npy, the photo's height × width, in [0, 1]).

This module owns DIR's layout: for PHOTOS/a/b.jpg, DIR/a/b.jpg.overlay.png and DIR/a/b.jpg.cam.npy
(the full name is kept, so b.jpg and b.png never share a file). Each file is written atomically.
Grad-CAM needs the model's weights, so the export must sit in its run dir.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from app import storage
from app.data.preprocess import DEFAULT_CROP_FRACTION
from app.errors import UserError
from app.models import gradcam
from app.run_dir import RunDir
from app.serving.runtime import host_decoder

OVERLAY, CAM = ".overlay.png", ".cam.npy"


def explained_paths(out: Path, relative: Path) -> tuple[Path, Path]:
    """(overlay PNG, map .npy) of the photo at `relative` under the source."""
    base = out / relative
    return base.with_name(base.name + OVERLAY), base.with_name(base.name + CAM)


class PhotoExplainer:
    def __init__(self, version: Path, out: Path) -> None:
        run = RunDir.of_export(version)
        if run is None:
            raise UserError(f"--explain: {version} is not inside its run dir; Grad-CAM needs the run's weights")
        self.maps = gradcam.explainer(run.load().build_model())
        self.decode = host_decoder(version)
        self.out = out

    def write(self, photos: list[tuple[Path, bytes]], class_ids: list[int]) -> None:
        """Maps of `class_ids` for these (relative path, bytes) photos, all decodable."""
        from PIL import Image

        pixels = self.decode(np.array([data for _, data in photos], dtype=object)).astype(np.float32)
        for (relative, data), cam in zip(photos, self.maps(pixels, class_ids)):
            with Image.open(io.BytesIO(data)) as image:
                photo = np.asarray(image.convert("RGB"))
            heat = gradcam.on_photo(cam, photo.shape[0], photo.shape[1], DEFAULT_CROP_FRACTION)
            overlay_path, cam_path = explained_paths(self.out, relative)
            overlay_path.parent.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            Image.fromarray(gradcam.overlay(photo, heat)).save(buffer, format="PNG")
            storage.write_bytes_atomic(overlay_path, buffer.getvalue())
            buffer = io.BytesIO()
            np.save(buffer, heat)
            storage.write_bytes_atomic(cam_path, buffer.getvalue())
