"""`photoclf predict --explain DIR`: a Grad-CAM map (app.models.gradcam) of each photo's top class,
as an overlay PNG and the map itself (float32 .npy, the photo's height × width, in [0, 1]).

This module owns DIR's layout: for PHOTOS/a/b.jpg, DIR/a/b.jpg.overlay.png and DIR/a/b.jpg.cam.npy
(the full name is kept, so b.jpg and b.png never share a file). Each file is written atomically.
Grad-CAM needs the model's weights, so the export must sit in its run dir.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np

from app import storage
from app.data.display import open_photo
from app.data.preprocess import DEFAULT_CROP_FRACTION
from app.errors import UserError
from app.export.rebuild import rebuild_served_model
from app.inference.host_runtimes import host_decoder
from app.inference.runtime import tiny_jpeg
from app.models import gradcam
from app.run_dir import RunDir

OVERLAY, CAM = ".overlay.png", ".cam.npy"


def explained_paths(out: Path, relative: Path) -> tuple[Path, Path]:
    """(overlay PNG, map .npy) of the photo at `relative` under the source."""
    base = out / relative
    return base.with_name(base.name + OVERLAY), base.with_name(base.name + CAM)


class PhotoExplainer:
    """Grad-CAM maps of photos given as bytes, through the export's own decode; `out` is the
    folder `write` fills."""

    def __init__(self, version: Path, out: Path | None = None) -> None:
        run = RunDir.of_export(version)
        if run is None:
            raise UserError(f"--explain: {version} is not inside its run dir; Grad-CAM needs the run's weights")
        self.maps = gradcam.explainer(rebuild_served_model(run.load()))
        self.decode = host_decoder(version)
        self.out = out

    def warm_up(self) -> None:
        """Trace the map's function (about as long as building the model) and the decode once,
        on a blank image."""
        size = self.maps.image_size
        self.maps(np.zeros((1, size, size, 3), np.float32), [-1])
        self.decode(np.array([tiny_jpeg()], dtype=object))

    def heatmaps(
        self, images: list[bytes], class_ids: list[int], max_side: int | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """(photo uint8 [H, W, 3], its map float32 [H, W] in [0, 1]) of `class_ids` (-1: the top
        class), per image (all decodable); photo and map at most `max_side` pixels a side."""
        cams = self.cams(images, class_ids)[0]
        return [self.on_photo(data, cam, max_side) for data, cam in zip(images, cams)]

    def cams(self, images: list[bytes], class_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Maps at app.models.gradcam's resolution (14 × 14 for MobileNetV2 at 224), and the class ids they explain."""
        return self.maps(self.decode(np.array(images, dtype=object)).astype(np.float32), class_ids)

    @staticmethod
    def on_photo(image: bytes, cam: np.ndarray, max_side: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        photo = open_photo(image, max_side)
        return photo, gradcam.on_photo(cam, photo.shape[0], photo.shape[1], DEFAULT_CROP_FRACTION)

    def write(self, photos: list[tuple[Path, bytes]], class_ids: list[int]) -> None:
        """Maps of `class_ids` for these (relative path, bytes) photos, all decodable."""
        from PIL import Image

        for (relative, _), (photo, heat) in zip(photos, self.heatmaps([data for _, data in photos], class_ids)):
            overlay_path, cam_path = explained_paths(self.out, relative)
            overlay_path.parent.mkdir(parents=True, exist_ok=True)
            buffer = io.BytesIO()
            Image.fromarray(gradcam.overlay(photo, heat)).save(buffer, format="PNG")
            storage.write_bytes_atomic(overlay_path, buffer.getvalue())
            buffer = io.BytesIO()
            np.save(buffer, heat)
            storage.write_bytes_atomic(cam_path, buffer.getvalue())


def explain_answer(explainer: PhotoExplainer, image: bytes, class_id: int, classes: list[str]) -> dict:
    """The server's :explain answer: the class explained, its map at the model's feature
    resolution, and the photo with the map over it (a PNG data URL, at most 512 pixels a side)."""
    from PIL import Image

    (cam,), (explained,) = explainer.cams([image], [class_id])
    photo, heat = explainer.on_photo(image, cam, max_side=512)
    buffer = io.BytesIO()
    Image.fromarray(gradcam.overlay(photo, heat)).save(buffer, format="PNG")
    return {
        "label": classes[int(explained)],
        "map": np.round(cam, 4).tolist(),
        "overlay": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode(),
    }
