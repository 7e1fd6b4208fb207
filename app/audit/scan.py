"""One pass over the images: pixel hashes, size and contrast, a thumbnail, and a backbone embedding.

Embeddings are the frozen backbone's pooled features of `decode_for_eval` (the evaluation and
serving preprocessing), computed in batches with a progress bar and kept in
REPORT_DIR/embeddings.npz through phase 1's keyed feature cache (`load_or_compute`): a second
audit of the same files with the same backbone and weights reuses them.
"""

from __future__ import annotations

import base64
import gc
import hashlib
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf
from PIL import Image

from app.audit.items import AuditInput
from app.data.preprocess import EVAL_DECODE, eval_decoder
from app.inference.host_forward import HostForward, expected_precision
from app.models.backbones import get_backbone
from app.models.classifier import build_classifier
from app.models.pretrained import load_pretrained_backbone
from app.progress import progress_bar
from app.training.frozen import RowSink, load_or_compute, weights_fingerprint

THUMBNAIL_SIDE = 112
BATCH = 32


@dataclass
class Scan:
    indices: np.ndarray  # [n] item index of each readable image
    pixel_hashes: list[str]  # sha256 of the decoded pixels (and shape)
    heights: np.ndarray
    widths: np.ndarray
    pixel_std: np.ndarray  # standard deviation of all pixel values: ~0 for a blank image
    detail: np.ndarray  # mean absolute difference of neighbouring gray pixels: ~0 for gradients and blanks
    flat_share: np.ndarray  # share of pixels in the most common colour (16 levels per channel)
    thumbnails: list[str]  # data: URLs (JPEG)
    embeddings: np.ndarray  # [n, D] float32, L2-normalised
    weights_used: str
    weights_warning: str | None


def _thumbnail(pixels: np.ndarray) -> str:
    image = Image.fromarray(pixels)
    image.thumbnail((THUMBNAIL_SIDE, THUMBNAIL_SIDE))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(out.getvalue()).decode()


def _describe(pixels: np.ndarray) -> tuple[str, float, float, float]:
    """(pixel hash, pixel std, detail, flat share): what the cheap outlier checks need."""
    digest = hashlib.sha256(str(pixels.shape).encode() + pixels.tobytes()).hexdigest()
    gray = pixels.astype(np.float32).mean(axis=2)
    detail = (
        (np.abs(np.diff(gray, axis=0)).mean() + np.abs(np.diff(gray, axis=1)).mean()) / 2
        if min(gray.shape) > 1
        else 0.0
    )
    q = (pixels // 16).reshape(-1, 3).astype(np.int64)
    flat_share = np.bincount(q[:, 0] * 256 + q[:, 1] * 16 + q[:, 2]).max() / len(q)
    return digest, float(pixels.std()), float(detail), float(flat_share)


def scan_images(
    audit_input: AuditInput,
    cache: Path,
    backbone: str = "mobilenet_v2",
    weights: str = "auto",
    image_size: int = 0,
    forward_runtime: str = "auto",
) -> Scan:
    """Everything the finders need, in one pass; the backbone runs only when `cache` is stale, on
    the host's fastest agreeing runtime (`forward_runtime`: app.inference.host_forward)."""
    spec = get_backbone(backbone)
    size = image_size or spec.default_size
    pretrained = load_pretrained_backbone(spec, size, weights)
    features = build_classifier(spec, pretrained.model, max(2, len(audit_input.classes)), size, 0.0).features_model
    key = _cache_key(audit_input, spec.name, weights_fingerprint(pretrained.model), size, forward_runtime)
    cols: dict[str, list] = {
        k: [] for k in ("indices", "hashes", "heights", "widths", "stds", "detail", "flat", "thumbs")
    }

    def embed() -> dict[str, np.ndarray]:
        forward = HostForward(lambda x: features(x, training=False), (size, size, 3), forward_runtime,
                              len(audit_input.items), bfloat16=True)  # fmt: skip
        rows = RowSink(len(audit_input.items))  # held once, never as batches and a concatenation of them
        _pass(audit_input, cols, forward, size, lambda batch: rows.add(np.asarray(batch, np.float32)))
        del forward
        gc.collect()  # the converted runtime's graphs sit in reference cycles: freed now, before the finders
        embeddings = rows.done(empty=np.zeros((0, features.output_shape[-1]), np.float32))
        return {"embeddings": _normalised(embeddings)}

    arrays = load_or_compute(cache, key, embed, "audit embeddings")
    if not cols["indices"]:  # the embeddings came from the cache: the cheap part of the pass still runs
        _pass(audit_input, cols, None, size)
    return Scan(
        np.array(cols["indices"], np.int64),
        cols["hashes"],
        np.array(cols["heights"]),
        np.array(cols["widths"]),
        np.array(cols["stds"]),
        np.array(cols["detail"]),
        np.array(cols["flat"]),
        cols["thumbs"],
        arrays["embeddings"],
        pretrained.weights_used,
        pretrained.warning,
    )


def _cache_key(audit_input: AuditInput, backbone: str, weights: str, size: int, forward_runtime: str) -> dict:
    """What the embeddings depend on: the photos, the backbone and its weights, the decode, and
    the precision the pass will likely run in."""
    key = {
        "input": audit_input.fingerprint,
        "backbone": backbone,
        "weights": weights,
        "image_size": size,
        "decode": EVAL_DECODE,
    }
    precision = expected_precision(forward_runtime, len(audit_input.items))
    return key | ({} if precision == "float32" else {"precision": precision})  # float32 keeps older caches' keys


def _pass(
    audit_input: AuditInput,
    cols: dict[str, list],
    forward: HostForward | None,
    size: int,
    embedded: Callable[[np.ndarray], None] | None = None,
) -> None:
    """Read every image once: fill `cols`; hand each batch of `forward`'s embeddings to
    `embedded` (where given), in the images' order."""
    pending = []
    total = len(audit_input.items)

    def embed_pending() -> None:
        embedded(forward(tf.stack(pending).numpy().astype(np.float32)))
        pending.clear()

    with progress_bar(total, "img", "Embedding" if embedded else "Reading") as bar:
        for index, jpeg in audit_input.read():
            pixels = tf.io.decode_jpeg(jpeg, channels=3).numpy()
            digest, std, detail, flat = _describe(pixels)
            values = (index, digest, pixels.shape[0], pixels.shape[1], std, detail, flat, _thumbnail(pixels))
            for name, value in zip(cols, values):
                cols[name].append(value)
            if embedded:
                pending.append(eval_decoder(size)(jpeg))
                if len(pending) == BATCH:
                    embed_pending()
            bar.update(1)
        if pending:
            embed_pending()
        bar.update(total - bar.n)  # unreadable files count as done


def _normalised(embeddings: np.ndarray) -> np.ndarray:
    """The rows scaled, in place, to length 1 (an all-zero row stays zero)."""
    lengths = np.sqrt(np.einsum("ij,ij->i", embeddings, embeddings))  # no squared copy of them all
    embeddings /= np.maximum(lengths, 1e-12)[:, None]
    return embeddings
