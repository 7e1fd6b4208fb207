"""Image ops shared by training, evaluation and the exported serving graph.

`decode_for_eval` is THE evaluation preprocessing: the eval pipeline maps it over records and the
serving signature maps it over request bytes, so train/serve skew cannot creep in. The decode
ops work on a single image (eagerly or inside tf.data) and return uint8, so what crosses to the
accelerator is a quarter of float32's bytes; `color_jitter` works on one image or a whole batch
at once, with plain arithmetic: the training step runs it on the device (`app/training/steps.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

from app.data import image_header

# For the functions handed to tf.data and tf.function: they use TF's own control flow
# (tf.cond, tf.switch_case), so AutoGraph's rewrite of their Python source, 20-150 ms each on
# first use, buys nothing (0.7 s of a default fine_tune.py run, and as much in its export).
as_written = tf.autograph.experimental.do_not_convert

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
    def off() -> Augment:
        return Augment(random_crop=False, flip=False, color_jitter=0.0)

    @property
    def enabled(self) -> bool:
        return self.random_crop or self.flip or self.color_jitter > 0


def _resize(image: tf.Tensor, image_size: int) -> tf.Tensor:
    """Bilinear with antialiasing, so large photos shrink without aliasing."""
    return to_uint8(tf.image.resize(image, [image_size, image_size], method="bilinear", antialias=True))


def to_uint8(images: tf.Tensor) -> tf.Tensor:
    """Round float pixels in 0..255 to uint8 (saturating): the dtype every pipeline hands over."""
    return tf.saturate_cast(tf.round(images), tf.uint8)


def decode_for_eval(encoded: tf.Tensor, image_size: int, crop_fraction: float = DEFAULT_CROP_FRACTION) -> tf.Tensor:
    """Encoded JPEG/PNG/GIF/BMP bytes → uint8 [S, S, 3].

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


def decode_within_limit(encoded: tf.Tensor, image_size: int, crop_fraction: float, max_megapixels: float) -> tf.Tensor:
    """`decode_for_eval` behind the image-bomb guard: the header's size is checked before decoding."""
    within = image_header.assert_within(image_header.header_size(encoded), max_megapixels)
    with tf.control_dependencies([within]):
        return decode_for_eval(tf.identity(encoded), image_size, crop_fraction)


def decode_batch(encoded: tf.Tensor, image_size: int, crop_fraction: float, max_megapixels: float) -> tf.Tensor:
    """String [N] of request bytes → uint8 [N, S, S, 3]; the serving graph and the host runtimes use it."""
    return tf.map_fn(
        lambda b: decode_within_limit(b, image_size, crop_fraction, max_megapixels),
        encoded,
        fn_output_signature=tf.TensorSpec([image_size, image_size, 3], tf.uint8),
    )


def decode_random_crop(encoded: tf.Tensor, image_size: int, seed: tf.Tensor, augment: Augment) -> tf.Tensor:
    """Inception-style random-resized crop applied while decoding, then a random flip.

    Only the crop window is decoded, at a reduced scale when it is large (`_decode_crop`), and
    the flip is done on the small uint8 crop before resizing; uint8 out. `seed` is a shape-[2]
    int tensor; every op is stateless, so a seeded pipeline is reproducible. Resizing is plain
    bilinear: after the scaled decode a crop shrinks by less than 2×, where antialiasing
    changes little and costs a lot (python -m benchmarks.input_pipeline).
    """
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]),
        seed=crop_seed,
        min_object_covered=0.0,
        aspect_ratio_range=augment.aspect_ratio_range,
        area_range=augment.area_range,
        max_attempts=10,
    )
    image = _decode_crop(encoded, tf.concat([begin[:2], size[:2]], axis=0), image_size)
    if augment.flip:
        flip = tf.random.stateless_uniform([], flip_seed) < 0.5
        image = tf.cond(flip, lambda: tf.reverse(image, axis=[1]), lambda: image)
    image = to_uint8(tf.image.resize(image, [image_size, image_size], method="bilinear"))
    return tf.ensure_shape(image, [image_size, image_size, 3])


def _decode_crop(encoded: tf.Tensor, window: tf.Tensor, image_size: int) -> tf.Tensor:
    """Decode only `window` ([y, x, height, width]) of a JPEG, at the smallest of libjpeg's DCT
    scales (1, 1/2, 1/4, 1/8) that leaves the window's shorter side at least `image_size`. A
    phone photo's crop is then decoded at a quarter or an eighth of its pixels, already
    low-passed, instead of being decoded whole and shrunk 5-15× by a bilinear resize that
    aliases; the crops of small photos decode at full scale, as before."""
    offset_y, offset_x, height, width = tf.unstack(window)
    shorter = tf.minimum(height, width)
    scale_index = tf.reduce_sum(tf.cast(shorter // image_size >= tf.constant([2, 4, 8]), tf.int32))

    def at(ratio: int):
        scaled = tf.stack([offset_y // ratio, offset_x // ratio, height // ratio, width // ratio])
        return lambda: tf.io.decode_and_crop_jpeg(encoded, scaled, channels=3, ratio=ratio)

    return tf.switch_case(scale_index, [at(1), at(2), at(4), at(8)])


LUMA = (0.2989, 0.5870, 0.1140)  # ITU-R BT.601, as tf.image.rgb_to_grayscale


def color_jitter(images: tf.Tensor, seed: tf.Tensor, strength: float) -> tf.Tensor:
    """Random brightness, contrast and saturation on [..., H, W, 3] images in 0..255 (uint8 or
    float); float32 out.

    Works on one image or a batch (independent factors per image). The training step applies it
    to whole batches, on the device. `seed` is a shape-[2] int tensor (stateless: reproducible).
    """
    batch_shape = tf.shape(images)[:-3]
    s_b, s_c, s_s = tf.unstack(tf.random.experimental.stateless_split(seed, 3))

    def factor(s: tf.Tensor) -> tf.Tensor:
        return tf.random.stateless_uniform(batch_shape, s, 1.0 - strength, 1.0 + strength)

    return _apply_color_jitter(images, factor(s_b), factor(s_c), factor(s_s))


@tf.function(jit_compile=True, autograph=False)
def _apply_color_jitter(
    images: tf.Tensor, brightness: tf.Tensor, contrast: tf.Tensor, saturation: tf.Tensor
) -> tf.Tensor:
    """Brightness, then contrast around the brightened image's mean, then saturation towards its
    luma, composed into one linear expression of the pixels. XLA fuses it into a single pass
    (on 2 CPU cores 2.7x faster than the same ops unfused, for a batch of 32 at 224)."""
    x = tf.cast(images, tf.float32)
    b, c, s = (f[..., None, None, None] for f in (brightness, contrast, saturation))
    gray = tf.reduce_sum(x * tf.constant(LUMA), axis=-1, keepdims=True)
    mean = tf.reduce_mean(x, axis=[-3, -2, -1], keepdims=True) * b
    out = b * c * (s * x + (1.0 - s) * gray) + (1.0 - c) * mean * (s + (1.0 - s) * sum(LUMA))
    return tf.clip_by_value(out, 0.0, 255.0)
