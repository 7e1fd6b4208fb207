"""Typed, immutable training configuration: defaults ← TOML file ← `--set key=value` overrides.

The resolved config is saved in every run directory (config.json), and a run directory
refuses to continue under a different config, so a result can always be traced to its settings.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path

from app.errors import UserError
from app.storage import check_output_folder, is_url, read_json_object, write_text_atomic


def _key(default: typing.Any, help: str, *, flag: bool = False, choices: tuple[str, ...] = ()) -> typing.Any:
    """A config key: its default and help are typed here once; fine_tune.py builds its flags and
    --help from them. `flag`: also a command-line flag (--image-size for image_size)."""
    return dataclasses.field(default=default, metadata={"help": help, "flag": flag, "choices": choices})


@dataclass(frozen=True)
class TrainConfig:
    # data
    data: str = _key(
        "",
        "TFRecord folder or gs:// URL from photoclf convert; empty = the built-in demo (built if missing)",
        flag=True,
    )
    out: str = _key("runs/demo", "run directory: config, logs, checkpoints, metrics, export", flag=True)
    # model
    backbone: str = _key(
        "mobilenet_v2",
        "backbone registry key (see docs/training.md), a TF-Hub handle URL or a SavedModel folder",
        flag=True,
    )
    weights: str = _key(
        "auto",
        "auto | imagenet | none | PATH to a weights file (.h5, .weights.h5; .npz for EfficientNet-Lite)",
        flag=True,
    )
    image_size: int = _key(0, "input size in pixels; 0 = the backbone's default", flag=True)
    init_from: str = _key(
        "",
        "an earlier run dir to start from (its kept weights); with more classes the old classes' weights"
        " in the classification layer are kept and the new ones start fresh",
        flag=True,
    )
    dropout: float = _key(0.2, "dropout before the logits layer")
    # phase 1: frozen backbone, new head
    epochs_head: int = _key(10, "phase-1 epochs, frozen backbone (early stopping may end sooner)", flag=True)
    lr_head: float = _key(
        3e-3,
        "phase-1 learning rate (AdamW); auto = the learning-rate finder's suggestion"
        " (photoclf find-lr), swept on this run's data and model before phase 1",
    )
    feature_views: str = _key(
        "auto",
        "phase 1's input: augmented views per training image, run through the frozen backbone once"
        " and cached as features: auto (2 where that pays: one worker and room for them; else"
        " 0) | 0 (images, decoded and augmented every epoch) | N (N views, always cached)",
    )
    feature_store: str = _key(
        "auto",
        "where cached backbone features are kept across runs, by photo content (a grown dataset or an"
        " --init-from run computes only new photos): auto = $PHOTOCLF_CACHE_DIR or ~/.cache/photoclf;"
        " run = inside the run dir only; or a folder",
    )
    forward_runtime: str = _key(
        "auto",
        "what runs the frozen backbone's passes that train nothing (phase 1's features, the activations"
        " at phase 2's cut, phase 2's layers below the cut on fresh images): auto (OpenVINO in float32,"
        " where it agrees with TensorFlow on the first batch and is faster; see"
        " docs/training.md) | tensorflow | openvino",
        choices=("auto", "tensorflow", "openvino"),
    )
    # phase 2: top of the backbone unfrozen
    epochs_finetune: int = _key(10, "phase-2 epochs, top of the backbone unfrozen", flag=True)
    lr_finetune: float = _key(
        1e-4,
        "phase-2 peak learning rate: linear warmup, then cosine decay; auto = the"
        " finder's suggestion, swept under the trained head before phase 2",
    )
    warmup_fraction: float = _key(0.1, "share of phase-2 steps spent warming up")
    phase2_mode: str = _key(
        "auto",
        "what phase 2 trains on: images (decoded, freshly augmented each epoch, its whole schedule)"
        " | views (phase 1's cached views' activations where its layers begin: a fraction of an"
        " epoch on images, stopping early) | auto (images; views for a run started --init-from"
        " an earlier one; see app/training/plan.py)",
        choices=("auto", "views", "images"),
    )
    unfreeze: str = _key(
        "blocks:4", "what phase 2 trains: blocks:N | fraction:F (of blocks) | layer:NAME (that layer and above)"
    )
    layer_decay: float = _key(
        1.0,
        "phase 2's layer-wise rate decay: the head and top block train at lr_finetune, each"
        " block below at the rate of the block above x this; 1 = one rate for all",
    )
    # both phases
    batch_size: int = _key(
        32,
        "per-replica batch size; the global batch is this x the number of replicas (or the train split, if smaller)",
        flag=True,
    )
    weight_decay: float = _key(1e-4, "decoupled weight decay (AdamW); not applied to biases or BatchNorm")
    label_smoothing: float = _key(0.1, "label smoothing of the training loss (datasets without side features)")
    side_label_smoothing: float = _key(
        0.0,
        "label smoothing of the training loss for datasets with side features:"
        " smoothing caps the logits' margins, and a threshold on one column stayed"
        " blurred under it (docs/side-features.md)",
    )
    side_path: str = _key(
        "auto",
        "whether side features reach the head: auto (left out where a logistic regression on"
        " phase 1's features does not gain from them; docs/side-features.md) | on",
        choices=("auto", "on"),
    )
    class_weights: bool = _key(False, "weight the loss by inverse class frequency from dataset.json")
    early_stopping_patience: int = _key(3, "epochs without improvement of select_by before a phase stops")
    select_by: str = _key(
        "val_loss",
        "what decides whether a phase-2 epoch beat phase 1, picks phase 1's kept epoch"
        " (and an early-stopped phase 2's) and stops a phase early: val_loss | val_accuracy"
        " (ties broken by val_loss)",
        choices=("val_loss", "val_accuracy"),
    )
    ema_decay: float = _key(
        0.0,
        "validate, keep and export an exponential moving average of the weights: 0 = off;"
        " else its decay, warmed up as min(decay, (1 + step) / (10 + step))",
    )
    augment: bool = _key(True, "random-resized crop + flip + colour jitter during training")
    color_jitter: float = _key(0.2, "strength of brightness/contrast/saturation jitter; 0 = off")
    seed: int = _key(0, "seed for weights init, shuffling and augmentation")
    calibrate: bool = _key(
        True,
        "fit a temperature on the validation split after training; the export serves"
        " softmax(logits / T) (calibrated confidence, same predictions)",
    )
    unknown_accept: float = _key(
        0.95,
        'share of validation photos the export\'s "none of these" threshold accepts as one of the'
        " classes (single-label models; the export answers unknown above it); 0 = no such answer",
    )
    # performance and scale
    mixed_precision: str = _key("auto", "auto (on for GPUs) | on | off", choices=("auto", "on", "off"))
    strategy: str = _key("auto", "distribution strategy", choices=("auto", "default", "mirrored", "multiworker", "tpu"))
    jit_compile: str = _key(
        "auto",
        "XLA-compile the train step: auto (on for GPUs, as Keras does; off on CPUs, where it"
        " made training slower) | true | false",
        choices=("auto", "true", "false"),
    )
    steps_per_execution: int = _key(1, "train steps per tf.function call; raise on fast accelerators")
    max_steps_per_epoch: int = _key(0, "0 = a full pass over the training split; >0 caps it (smoke runs)")
    data_service: str = _key(
        "",
        "grpc://HOST:PORT of a tf.data service dispatcher (photoclf data-service) that"
        " decodes and augments the training input; empty = this machine does",
        flag=True,
    )

    def __post_init__(self) -> None:  # feature_views=3 from code says what "3" or "03" from a file says
        views = str(self.feature_views).strip().lower()
        object.__setattr__(self, "feature_views", str(int(views)) if views.isdigit() else views)

    def replace(self, **changes: typing.Any) -> TrainConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, typing.Any]:
        return dataclasses.asdict(self)

    @property
    def cached_views(self) -> int:
        """Phase 1's views per training image where it trains on cached features (auto: AUTO_VIEWS)."""
        return AUTO_VIEWS if self.feature_views == "auto" else int(self.feature_views)


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
AUTO_RATES = ("lr_head", "lr_finetune")  # may be "auto": resolved by app.training.lr_finder in the run
AUTO_VIEWS = 2  # feature_views = auto: views per image (benchmarks/README.md, "Phase 1 on cached features")
RETIRED = {"cache_features": "feature_views says it now: 0 = phase 1 on images, N = N cached views, auto"}
RANGES: dict[str, tuple[typing.Callable[[typing.Any], bool], str]] = {  # key: (holds, what it must be)
    "batch_size": (lambda v: v >= 1, ">= 1"),
    "epochs_head": (lambda v: v >= 0, ">= 0"),
    "epochs_finetune": (lambda v: v >= 0, ">= 0"),
    "dropout": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
    "label_smoothing": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
    "side_label_smoothing": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
    "lr_head": (lambda v: v > 0, "> 0 or auto"),
    "lr_finetune": (lambda v: v > 0, "> 0 or auto"),
    "warmup_fraction": (lambda v: 0.0 <= v < 1.0, "in [0, 1)"),
    "steps_per_execution": (lambda v: v >= 1, ">= 1"),
    "image_size": (lambda v: v >= 0, ">= 0 (0 = the backbone's default)"),
    "early_stopping_patience": (lambda v: v >= 1, ">= 1"),
    "max_steps_per_epoch": (lambda v: v >= 0, ">= 0 (0 = the whole split)"),
    "layer_decay": (lambda v: 0.0 < v <= 1.0, "in (0, 1]"),
    "ema_decay": (lambda v: 0.0 <= v < 1.0, "in [0, 1) (0 = off)"),
    "unknown_accept": (lambda v: 0.0 <= v <= 1.0, "in [0, 1] (0 = no unknown answer)"),
    "unfreeze": (lambda v: v.split(":")[0] in ("blocks", "fraction", "layer"), "blocks:N, fraction:F or layer:NAME"),
}


def _coerce(key: str, value: typing.Any, origin: str) -> typing.Any:
    """Convert a TOML/CLI value to the field's type, with an error naming where it came from."""
    if key in RETIRED:
        raise UserError(f"{origin}: '{key}' is retired; {RETIRED[key]}")
    if key not in FIELDS:
        raise UserError(
            f"{origin}: unknown config key '{key}'{_did_you_mean(key)} (known: {', '.join(sorted(FIELDS))})"
        )
    if key in AUTO_RATES and str(value).strip().lower() == "auto":
        return "auto"
    if key == "feature_views":
        return _views(value, origin)
    kind, choices = type(FIELDS[key].default), FIELDS[key].metadata["choices"]
    if choices and isinstance(value, (str, bool)):
        value = str(value).lower()  # TOML `jit_compile = true` means the choice "true"
    try:
        if kind is bool and isinstance(value, str):
            if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(value)
            value = value.lower() in ("true", "1", "yes")
        elif kind is bool and not isinstance(value, bool):
            raise ValueError(value)
        else:
            value = kind(value)
    except (TypeError, ValueError):
        raise UserError(f"{origin}: '{key}' must be {kind.__name__}, got {value!r}") from None
    if kind is float and not math.isfinite(value):  # inf passed `> 0` (lr_finetune = inf trained a run)
        raise UserError(f"{origin}: '{key}' must be a finite number, got {value!r}")
    if choices and value not in choices:
        raise UserError(f"{origin}: '{key}' must be one of {choices}, got {value!r}")
    holds, rule = RANGES.get(key, (lambda v: True, ""))
    if not holds(value):
        raise UserError(f"{origin}: '{key}' must be {rule}, got {value!r}")
    return value


def _did_you_mean(key: str) -> str:
    """The known keys a user most likely meant, the way they would want the error to read first."""
    nearest = nearest_keys(key)
    return f": did you mean {' or '.join(repr(name) for name in nearest)}?" if nearest else ""


def nearest_keys(key: str) -> list[str]:
    """A misspelling's nearest key (`img_size`: image_size); else the keys named by its words
    (`epochs`: both phases' epochs; `patience`); else the keys whose help speaks of every one of
    them (`cache_dir`: feature_store; `learning_rate`: both phases' rates). More than 3 is no hint."""
    key = key.lower().replace("-", "_")
    close = difflib.get_close_matches(key, FIELDS, n=1, cutoff=0.8)
    if close:
        return close
    by_name = {name: _shared_words(key, set(name.split("_")), shortest=2) for name in FIELDS}
    nearest = _best(by_name)
    if not nearest:
        parts = [part for part in key.split("_") if len(part) >= 3]
        by_help = {name: _shared_words(key, _help_words(name), shortest=3) for name in FIELDS}
        nearest = _best({name: score for name, score in by_help.items() if score >= 2 * len(parts)})
    if not nearest:
        return difflib.get_close_matches(key, FIELDS, n=1)
    return nearest if len(nearest) <= 3 else []


def _best(scores: dict[str, int]) -> list[str]:
    top = max(scores.values(), default=0)
    return [name for name, score in scores.items() if top and score == top]


def _help_words(name: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", FIELDS[name].metadata["help"].lower()))


def _shared_words(key: str, words: set[str], shortest: int) -> int:
    """How well the words of `key` (those of `shortest` letters or more) match `words`: 2 for each
    that is one of them or starts one (cache: cached), 1 for each that begins with one of 3
    letters or more (output: out)."""
    return sum(
        max((2 if word.startswith(part) else int(part.startswith(word) and len(word) >= 3)) for word in words)
        for part in key.split("_")
        if len(part) >= shortest
    )


def _views(value: typing.Any, origin: str) -> typing.Any:
    """`feature_views`: "auto" or a count of views >= 0 (TrainConfig keeps it as text, "3")."""
    text = str(value).strip().lower()
    if text == "auto" or (text.isdigit() and not isinstance(value, bool)):
        return value
    raise UserError(f"{origin}: 'feature_views' must be auto or a number of views >= 0, got {value!r}")


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, typing.Any] | None = None,
    flags: dict[str, typing.Any] | None = None,
) -> TrainConfig:
    """Defaults, then the TOML file (flat keys, or under a [train] table), then `overrides` (as
    --set gives them), then `flags` (the command's own flags, which an error names as such)."""
    values: dict[str, typing.Any] = {}
    if path is not None:
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"--config: no such file {path}") from None
        except (IsADirectoryError, UnicodeDecodeError) as err:
            why = "a folder" if isinstance(err, IsADirectoryError) else "not UTF-8 text"
            raise UserError(f"--config {path}: {why}; give a TOML file (examples in configs/)") from None
        except tomllib.TOMLDecodeError as err:
            raise UserError(f"{path}: not valid TOML ({err})") from None
        values.update({k: _coerce(k, v, str(path)) for k, v in _train_keys(raw, path).items()})
    values.update({key: _coerce(key, value, "--set") for key, value in (overrides or {}).items()})
    values.update({key: _coerce(key, value, f"--{key.replace('_', '-')}") for key, value in (flags or {}).items()})
    return validate(TrainConfig(**values))


def check_paths_exist(cfg: TrainConfig) -> None:
    """A local `data` folder or `init_from` run dir that is not there, or an `out` that cannot be
    written, said before a script imports TensorFlow; what they must hold is checked where they
    are read."""
    if cfg.data and not is_url(cfg.data) and not Path(cfg.data).exists():
        raise UserError(f"--data {cfg.data}: no such folder")
    if cfg.init_from and not Path(cfg.init_from).is_dir():
        raise UserError(f"--init-from {cfg.init_from}: no such run dir")
    check_output_folder(cfg.out, "--out")


def _train_keys(raw: dict[str, typing.Any], path: Path) -> dict[str, typing.Any]:
    """A file's keys: flat, under a [train] table, or both (keys above the table are read too,
    where taking the table alone dropped them without a word); one key in both is refused."""
    table = raw.get("train")
    if not isinstance(table, dict):
        return raw
    flat = {key: value for key, value in raw.items() if key != "train"}
    twice = sorted(flat.keys() & table.keys())
    if twice:
        raise UserError(f"{path}: {', '.join(map(repr, twice))} given twice, above [train] and in it; keep one")
    return flat | table


def parse_set(items: list[str]) -> dict[str, str]:
    """`--set key=value` pairs (keys may use dashes)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--set: expected key=value, got '{item}'")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def validate(cfg: TrainConfig) -> TrainConfig:
    """What no single key says: checks across keys (each key's own range is checked as it is read)."""
    if cfg.epochs_head + cfg.epochs_finetune == 0:
        raise UserError("config: nothing to train: epochs_head and epochs_finetune are both 0")
    if "://" in cfg.out:
        raise UserError(
            f"--out: {cfg.out}: the run dir must be a local path (or a mounted shared folder); --data may be a URL"
        )
    if cfg.data_service:
        from app.data.service import parse_address

        parse_address(cfg.data_service)
    return cfg


def save_config(cfg: TrainConfig, path: Path) -> None:
    write_text_atomic(path, json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n")


def read_saved_config(path: Path) -> TrainConfig:
    """A run dir's config.json; keys an older version wrote and this one no longer has (such as
    phase2_on_views, now phase2_mode, phase2_keeps_accuracy, now always on, or views_above and
    finetune_time_cap, gone with the plan that used them) are dropped, and cache_features joins
    feature_views, so older runs still load, export and evaluate."""
    saved = read_json_object(path)
    if "cache_features" in saved:
        saved["feature_views"] = _joined_views(saved.pop("cache_features"), saved.get("feature_views", AUTO_VIEWS))
    return TrainConfig(**{k: v for k, v in saved.items() if k in FIELDS})


def _joined_views(cache_features: object, views: object) -> str:
    """An older run's cache_features (auto | true | false) and feature_views (a count) as one key."""
    if cache_features == "false":
        return "0"
    return "auto" if cache_features == "auto" and views == AUTO_VIEWS else str(views)
