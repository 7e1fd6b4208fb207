"""Image ops shared by training, evaluation and the exported serving graph.

`decode_for_eval` is THE evaluation preprocessing: the eval pipeline maps it over records and the
serving signature maps it over request bytes, so train/serve skew cannot creep in. The decode
ops work on a single image (eagerly or inside tf.data) and return uint8, so what crosses to the
accelerator is a quarter of float32's bytes; `color_jitter` works on one image or a whole batch
at once, with plain arithmetic: the training step runs it on the device (`app/training/steps.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf

from app.data import exif, image_header

# For the functions handed to tf.data and tf.function: they use TF's own control flow
# (tf.cond, tf.switch_case), so AutoGraph's rewrite of their Python source, paid on first use,
# buys nothing.
as_written = tf.autograph.experimental.do_not_convert

EVAL_DECODE = "centre crop at DCT scale"  # in the caches' keys: features made by another eval decode are made again
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
    """Bilinear with antialiasing where a side shrinks, so large photos shrink without aliasing.
    An image no larger than the output (a small photo, a satellite tile) is enlarged by plain
    bilinear: there antialiasing widens no kernel, so the two filters agree (to a rounding step
    in a small fraction of the pixels) and plain bilinear is the faster kernel
    (benchmarks/README.md, "Offline commands")."""
    shrinks = tf.reduce_any(tf.shape(image)[:2] > image_size)
    return to_uint8(
        tf.cond(
            shrinks,
            lambda: tf.image.resize(image, [image_size, image_size], method="bilinear", antialias=True),
            lambda: tf.image.resize(image, [image_size, image_size], method="bilinear"),
        )
    )


def to_uint8(images: tf.Tensor) -> tf.Tensor:
    """Round float pixels in 0..255 to uint8 (saturating): the dtype every pipeline hands over."""
    return tf.saturate_cast(tf.round(images), tf.uint8)


def bilinear_to_uint8(images: tf.Tensor) -> tf.Tensor:
    """Round a bilinear resize of uint8 pixels to uint8 in one pass: its values are weighted means
    of pixels, inside 0..255, so half up and a truncating cast are `to_uint8` without the clamp,
    which the training input pays for on every photo."""
    return tf.cast(images + 0.5, tf.uint8)


def decode_for_eval(encoded: tf.Tensor, image_size: int, crop_fraction: float = DEFAULT_CROP_FRACTION) -> tf.Tensor:
    """Encoded JPEG/PNG/GIF/BMP/WebP bytes → uint8 [S, S, 3]: evaluation's, serving's and the feature
    cache's one preprocessing.

    Equivalent to "resize the shorter side to S / crop_fraction, then centre-crop S", done as
    crop-then-resize so only the kept pixels are resampled. A JPEG's centre crop is decoded alone,
    at the smallest of libjpeg's DCT scales (1, 1/2, 1/4, 1/8) that keeps its side at least S
    (`eval_scale`; the header gives the size): a 12-megapixel phone photo is decoded at 1/8 of
    its width, already low-passed, instead of whole and then shrunk 12×. Crops under 2S decode
    exactly as before, as every other format does. A JPEG's EXIF orientation is applied to the
    result (`app.data.exif`): the centred square crop turns with the photo, so turning it last is
    turning the photo first, as `photoclf convert` does.
    """
    is_jpeg = tf.equal(tf.strings.substr(encoded, 0, 3), b"\xff\xd8\xff")
    image = tf.cond(
        is_jpeg,
        lambda: exif.upright(_eval_jpeg(encoded, image_size, crop_fraction), exif.jpeg_orientation(encoded)),
        lambda: _resize(_eval_any_crop(encoded, crop_fraction), image_size),
    )
    return tf.ensure_shape(image, [image_size, image_size, 3])


def eval_decoder(image_size: int, crop_fraction: float = DEFAULT_CROP_FRACTION) -> Callable[[tf.Tensor], tf.Tensor]:
    """`decode_for_eval` at these settings as one traced function for the whole process: every
    tf.data pipeline that maps it calls the same graph instead of tracing it again, and a photo
    decoded one at a time (the audit) runs as a graph, not op by op."""
    return _traced_eval_decode(image_size, crop_fraction)  # one entry per setting, the fraction given or not


@functools.cache
def _traced_eval_decode(image_size: int, crop_fraction: float) -> Callable[[tf.Tensor], tf.Tensor]:
    return tf.function(
        lambda encoded: decode_for_eval(encoded, image_size, crop_fraction),
        input_signature=[tf.TensorSpec([], tf.string)],
        autograph=False,
    )


def centre_window(height: tf.Tensor, width: tf.Tensor, crop_fraction: float) -> tf.Tensor:
    """[top, left, side, side] of the centred square whose side is crop_fraction × the shorter side."""
    side = tf.cast(tf.cast(tf.minimum(height, width), tf.float32) * crop_fraction, tf.int32)
    side = tf.maximum(side, 1)
    return tf.stack([(height - side) // 2, (width - side) // 2, side, side])


def eval_scale(height: int, width: int, image_size: int, crop_fraction: float = DEFAULT_CROP_FRACTION) -> int:
    """The DCT scale denominator (1, 2, 4 or 8) `decode_for_eval` decodes a height × width JPEG at."""
    side = centre_window(tf.constant(height), tf.constant(width), crop_fraction)[2]
    return DCT_RATIOS[int(_scale_index(side, image_size))]


DCT_RATIOS = (1, 2, 4, 8)  # the scales libjpeg decodes at: 1/1, 1/2, 1/4, 1/8


def _scale_index(shorter: tf.Tensor, image_size: int) -> tf.Tensor:
    """Index in DCT_RATIOS of the smallest scale that keeps `shorter` pixels at least `image_size`."""
    return tf.reduce_sum(tf.cast(shorter // image_size >= tf.constant(DCT_RATIOS[1:]), tf.int32))


def _eval_jpeg(encoded: tf.Tensor, image_size: int, crop_fraction: float) -> tf.Tensor:
    shape = tf.io.extract_jpeg_shape(encoded)
    window = centre_window(shape[0], shape[1], crop_fraction)

    def at(ratio: int):
        if ratio == 1:  # a full decode: decoding the crop alone moved its border pixels
            return lambda: _resize(_eval_any_crop(encoded, crop_fraction), image_size)
        return lambda: _scaled_centre_crop(encoded, shape, window, image_size, ratio)

    return tf.switch_case(_scale_index(window[2], image_size), [at(ratio) for ratio in DCT_RATIOS])


def _scaled_centre_crop(
    encoded: tf.Tensor, shape: tf.Tensor, window: tf.Tensor, image_size: int, ratio: int
) -> tf.Tensor:
    """The centre crop from a 1/`ratio` decode. Its edges fall inside DCT blocks there, so the
    blocks around it are decoded and the exact crop is sampled from them (bilinear: it shrinks by
    less than 2×); snapping to whole blocks instead shifted the picture by up to ratio - 1 pixels,
    several times further from a full decode."""
    top, left, side = (tf.cast(window[i], tf.float32) / ratio for i in range(3))
    rows, cols = -(-shape[0] // ratio), -(-shape[1] // ratio)  # libjpeg's scaled size, rounded up
    y0, x0 = tf.cast(tf.floor(top), tf.int32), tf.cast(tf.floor(left), tf.int32)
    height = tf.minimum(tf.cast(tf.math.ceil(top + side), tf.int32) + 1, rows) - y0
    width = tf.minimum(tf.cast(tf.math.ceil(left + side), tf.int32) + 1, cols) - x0
    image = tf.io.decode_and_crop_jpeg(encoded, tf.stack([y0, x0, height, width]), channels=3, ratio=ratio)
    half = side / (2 * image_size)  # sample at the centres of the output's pixels
    span_y, span_x = tf.cast(height - 1, tf.float32), tf.cast(width - 1, tf.float32)
    box = tf.stack(
        [
            (top - tf.cast(y0, tf.float32) + half - 0.5) / span_y,
            (left - tf.cast(x0, tf.float32) + half - 0.5) / span_x,
            (top - tf.cast(y0, tf.float32) + side - half - 0.5) / span_y,
            (left - tf.cast(x0, tf.float32) + side - half - 0.5) / span_x,
        ]
    )
    sampled = tf.image.crop_and_resize(tf.cast(image, tf.float32)[None], box[None], [0], [image_size, image_size])
    return to_uint8(sampled[0])


def _eval_any_crop(encoded: tf.Tensor, crop_fraction: float) -> tf.Tensor:
    image = tf.io.decode_image(encoded, channels=0, expand_animations=False)  # as stored: alpha kept
    top, left, side, _ = tf.unstack(centre_window(tf.shape(image)[0], tf.shape(image)[1], crop_fraction))
    is_bmp = tf.equal(tf.strings.substr(encoded, 0, 2), b"BM")
    return rgb_on_white(image[top : top + side, left : left + side], is_bmp)


def rgb_on_white(image: tf.Tensor, is_bmp: tf.Tensor | bool = False) -> tf.Tensor:
    """uint8 [H, W, 1-4] (grey, grey + alpha, RGB, RGBA) → RGB, transparent pixels laid on white
    as `photoclf convert` lays them for training (app.data.convert): dropping the alpha showed the
    colour under a transparent background (often black) that training never saw, and a WebP with
    alpha could not be decoded to three channels at all. A 32-bit BMP's fourth byte is not alpha:
    it is unused and often 0 (all white, read as alpha), and Pillow ignores it."""
    channels = tf.shape(image)[-1]
    has_alpha = tf.logical_and(tf.equal(channels % 2, 0), tf.logical_not(is_bmp))
    colour = image[..., : tf.where(tf.equal(channels, 2), 1, tf.minimum(channels, 3))]
    colour = tf.ensure_shape(tf.cond(tf.equal(tf.shape(colour)[-1], 1), lambda: tf.tile(colour, [1, 1, 3]),
                                     lambda: colour), [None, None, 3])  # fmt: skip

    def on_white() -> tf.Tensor:
        alpha = tf.cast(image[..., -1:], tf.float32) / 255.0
        return to_uint8(tf.cast(colour, tf.float32) * alpha + 255.0 * (1.0 - alpha))

    return tf.cond(has_alpha, on_white, lambda: colour)


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


def batch_decoder(image_size: int, crop_fraction: float, max_megapixels: float) -> Callable[[tf.Tensor], tf.Tensor]:
    """`decode_batch` at these settings as one traced function for the whole process: the serving
    signatures of every export and the host runtimes' decode call the same graph instead of
    building its ops again (the image-bomb guard's header parsing is a large graph)."""
    return _traced_batch_decode(image_size, float(crop_fraction), float(max_megapixels))


@functools.cache
def _traced_batch_decode(image_size: int, crop_fraction: float, max_megapixels: float) -> Callable:
    return tf.function(
        lambda encoded: decode_batch(encoded, image_size, crop_fraction, max_megapixels),
        input_signature=[tf.TensorSpec([None], tf.string)],
        autograph=False,
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
    # From float32: TensorFlow's bilinear kernel reads float pixels faster than uint8 ones, with
    # the same values out (python -m benchmarks.input_pipeline).
    image = bilinear_to_uint8(tf.image.resize(tf.cast(image, tf.float32), [image_size, image_size], method="bilinear"))
    return tf.ensure_shape(image, [image_size, image_size, 3])


def _decode_crop(encoded: tf.Tensor, window: tf.Tensor, image_size: int) -> tf.Tensor:
    """Decode only `window` ([y, x, height, width]) of a JPEG, at the smallest of libjpeg's DCT
    scales (1, 1/2, 1/4, 1/8) that leaves the window's shorter side at least `image_size`. A
    phone photo's crop is then decoded at a quarter or an eighth of its pixels, already
    low-passed, instead of being decoded whole and shrunk 5-15× by a bilinear resize that
    aliases; the crops of small photos decode at full scale, as before."""
    offset_y, offset_x, height, width = tf.unstack(window)
    shorter = tf.minimum(height, width)

    def at(ratio: int):
        scaled = tf.stack([offset_y // ratio, offset_x // ratio, height // ratio, width // ratio])
        return lambda: tf.io.decode_and_crop_jpeg(encoded, scaled, channels=3, ratio=ratio)

    return tf.switch_case(_scale_index(shorter, image_size), [at(ratio) for ratio in DCT_RATIOS])


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

    # The mean outside XLA: XLA's CPU code for this reduction was slower than TensorFlow's own.
    means = tf.reduce_mean(tf.cast(images, tf.float32), axis=[-3, -2, -1])
    return _apply_color_jitter(images, means, factor(s_b), factor(s_c), factor(s_s))


@tf.function(jit_compile=True, autograph=False)
def _apply_color_jitter(
    images: tf.Tensor, means: tf.Tensor, brightness: tf.Tensor, contrast: tf.Tensor, saturation: tf.Tensor
) -> tf.Tensor:
    """Brightness, then contrast around the brightened image's mean, then saturation towards its
    luma, composed into one linear expression of the pixels. XLA fuses it into a single pass,
    faster than the same ops unfused (benchmarks/README.md, "Input pipeline")."""
    x = tf.cast(images, tf.float32)
    b, c, s = (f[..., None, None, None] for f in (brightness, contrast, saturation))
    gray = tf.reduce_sum(x * tf.constant(LUMA), axis=-1, keepdims=True)
    mean = means[..., None, None, None] * b
    out = b * c * (s * x + (1.0 - s) * gray) + (1.0 - c) * mean * (s + (1.0 - s) * sum(LUMA))
    return tf.clip_by_value(out, 0.0, 255.0)
