"""Image ops shared by training, evaluation and the exported serving graph.

`decode_for_eval` is THE evaluation preprocessing: the eval pipeline maps it over records and the
serving signature maps it over request bytes, so train/serve skew cannot creep in. Every op here
works on a single image (eagerly or inside tf.data), except `augment_batch`, which works on a
whole batch at once with plain arithmetic so it runs well on a GPU too.
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

DEFAULT_CROP_FRACTION = 0.875  # the classic 224/256: resize shorter side to 256, crop 224


@dataclass(frozen=True)
class Augment:
    """Training augmentation. `Augment.off()` means eval-style decoding with no randomness."""

    random_crop: bool = True
    area_range: tuple[float, float] = (0.25, 1.0)  # fraction of the image a random crop keeps
    aspect_ratio_range: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    color_jitter: float = 0.2  # max relative change of brightness/contrast/saturation; 0 = off

    @staticmethod
    def off() -> "Augment":
        return Augment(random_crop=False, flip=False, color_jitter=0.0)

    @property
    def enabled(self) -> bool:
        return self.random_crop or self.flip or self.color_jitter > 0


def _resize(image: tf.Tensor, image_size: int) -> tf.Tensor:
    """Bilinear with antialiasing, so large photos shrink without aliasing; float32 out."""
    return tf.image.resize(image, [image_size, image_size], method="bilinear", antialias=True)


def decode_for_eval(encoded: tf.Tensor, image_size: int, crop_fraction: float = DEFAULT_CROP_FRACTION) -> tf.Tensor:
    """Encoded JPEG/PNG/GIF/BMP bytes → float32 [S, S, 3] in 0..255.

    Equivalent to "resize the shorter side to S / crop_fraction, then centre-crop S", done as
    crop-then-resize so only the kept pixels are resampled.
    """
    image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    shape = tf.shape(image)
    height, width = shape[0], shape[1]
    side = tf.cast(tf.cast(tf.minimum(height, width), tf.float32) * crop_fraction, tf.int32)
    side = tf.maximum(side, 1)
    top, left = (height - side) // 2, (width - side) // 2
    crop = image[top : top + side, left : left + side]
    return tf.ensure_shape(_resize(crop, image_size), [image_size, image_size, 3])


def decode_random_crop(encoded: tf.Tensor, image_size: int, seed: tf.Tensor, augment: Augment) -> tf.Tensor:
    """Inception-style random-resized crop, applied while decoding: only the crop is decoded.

    `seed` is a shape-[2] int tensor; the op is stateless so a seeded pipeline is reproducible.
    """
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=augment.aspect_ratio_range,
        area_range=augment.area_range,
        max_attempts=10,
    )
    offset_y, offset_x, _ = tf.unstack(begin)
    crop_h, crop_w, _ = tf.unstack(size)
    window = tf.stack([offset_y, offset_x, crop_h, crop_w])
    image = tf.io.decode_and_crop_jpeg(encoded, window, channels=3)
    return tf.ensure_shape(_resize(image, image_size), [image_size, image_size, 3])


def augment_batch(images: tf.Tensor, seed: tf.Tensor, augment: Augment) -> tf.Tensor:
    """Per-image random flip and colour jitter on a float [B, H, W, 3] batch in 0..255."""
    seeds = tf.random.experimental.stateless_split(seed, 4)
    if augment.flip:
        images = tf.image.stateless_random_flip_left_right(images, seed=seeds[0])
    if augment.color_jitter > 0:
        j = augment.color_jitter
        batch = tf.shape(images)[0]

        def factors(s: tf.Tensor) -> tf.Tensor:
            return tf.random.stateless_uniform([batch, 1, 1, 1], s, 1.0 - j, 1.0 + j)

        images = images * factors(seeds[1])  # brightness
        mean = tf.reduce_mean(images, axis=[1, 2, 3], keepdims=True)
        images = (images - mean) * factors(seeds[2]) + mean  # contrast
        gray = tf.image.rgb_to_grayscale(images)
        images = (images - gray) * factors(seeds[3]) + gray  # saturation
        images = tf.clip_by_value(images, 0.0, 255.0)
    return images
