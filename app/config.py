"""Typed, immutable training configuration: defaults ← TOML file ← `--set key=value` overrides.

The resolved config is saved in every run directory (config.json), and a run directory
refuses to continue under a different config, so a result can always be traced to its settings.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from dataclasses import dataclass
from pathlib import Path

from app.storage import write_text_atomic
from app.errors import UserError


@dataclass(frozen=True)
class TrainConfig:
    # data
    data: str = ""  # TFRecord folder or gs:// URL from make_tfrecords.py; "" = the built-in demo (built if missing)
    out: str = "runs/demo"  # run directory: config, logs, checkpoints, metrics, export
    # model
    backbone: str = "mobilenet_v2"  # registry key; see app/models/backbones.py
    weights: str = "auto"  # auto | imagenet | none | path to a .h5/.weights.h5 file
    image_size: int = 0  # 0 = the backbone's default input size
    dropout: float = 0.2  # before the logits layer
    # phase 1: frozen backbone, new head
    epochs_head: int = 10
    lr_head: float = 1e-3  # AdamW
    cache_features: bool = False  # phase 1 on backbone features computed once (no augmentation)
    # phase 2: top of the backbone unfrozen
    epochs_finetune: int = 5
    lr_finetune: float = 1e-4  # peak; linear warmup then cosine decay
    warmup_fraction: float = 0.1  # of phase-2 steps
    unfreeze: str = "blocks:2"  # blocks:N | fraction:F (of blocks) | layer:NAME (that layer and above)
    # both phases
    batch_size: int = 32  # per replica; the global batch is this x the number of replicas
    weight_decay: float = 1e-4  # decoupled (AdamW); not applied to biases or BatchNorm
    label_smoothing: float = 0.1
    class_weights: bool = False  # weight the loss by inverse class frequency from dataset.json
    early_stopping_patience: int = 3  # epochs without val_loss improvement before stopping a phase
    augment: bool = True  # random-resized crop + flip + colour jitter during training
    color_jitter: float = 0.2  # strength of brightness/contrast/saturation jitter; 0 = off
    seed: int = 0
    # performance and scale
    mixed_precision: str = "auto"  # auto (on for GPU) | on | off
    strategy: str = "auto"  # auto | default | mirrored | multiworker | tpu
    steps_per_execution: int = 1  # train steps per tf.function call; raise on fast accelerators
    max_steps_per_epoch: int = 0  # 0 = a full pass over the training split; >0 caps it (smoke runs)
    data_service: str = ""  # grpc://host:port of a tf.data service dispatcher; "" = decode on this machine

    def replace(self, **changes: typing.Any) -> "TrainConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, typing.Any]:
        return dataclasses.asdict(self)


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_CHOICES = {
    "mixed_precision": ("auto", "on", "off"),
    "strategy": ("auto", "default", "mirrored", "multiworker", "tpu"),
}


def _coerce(key: str, value: typing.Any, origin: str) -> typing.Any:
    """Convert a TOML/CLI value to the field's type, with an error naming where it came from."""
    if key not in _FIELDS:
        raise UserError(f"{origin}: unknown config key '{key}' (known: {', '.join(sorted(_FIELDS))})")
    kind = type(getattr(TrainConfig(), key))
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
    if key in _CHOICES and value not in _CHOICES[key]:
        raise UserError(f"{origin}: '{key}' must be one of {_CHOICES[key]}, got {value!r}")
    return value


def load_config(path: str | Path | None = None, overrides: dict[str, typing.Any] | None = None) -> TrainConfig:
    """Defaults, then the TOML file (flat keys, or under a [train] table), then overrides."""
    values: dict[str, typing.Any] = {}
    if path is not None:
        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"--config: no such file {path}") from None
        except tomllib.TOMLDecodeError as err:
            raise UserError(f"{path}: not valid TOML ({err})") from None
        raw = raw.get("train", raw)
        values.update({k: _coerce(k, v, str(path)) for k, v in raw.items()})
    for key, value in (overrides or {}).items():
        values[key] = _coerce(key, value, f"--{key.replace('_', '-')}" if key in _FIELDS else "--set")
    return validate(TrainConfig(**values))


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
    checks = [
        (cfg.batch_size >= 1, "batch_size must be >= 1"),
        (cfg.epochs_head >= 0 and cfg.epochs_finetune >= 0, "epochs must be >= 0"),
        (cfg.epochs_head + cfg.epochs_finetune > 0, "nothing to train: epochs_head and epochs_finetune are both 0"),
        (0.0 <= cfg.dropout < 1.0, "dropout must be in [0, 1)"),
        (0.0 <= cfg.label_smoothing < 1.0, "label_smoothing must be in [0, 1)"),
        (cfg.lr_head > 0 and cfg.lr_finetune > 0, "learning rates must be > 0"),
        (0.0 <= cfg.warmup_fraction < 1.0, "warmup_fraction must be in [0, 1)"),
        (cfg.steps_per_execution >= 1, "steps_per_execution must be >= 1"),
        (cfg.image_size >= 0, "image_size must be >= 0 (0 = backbone default)"),
        (cfg.early_stopping_patience >= 1, "early_stopping_patience must be >= 1"),
        (cfg.max_steps_per_epoch >= 0, "max_steps_per_epoch must be >= 0"),
        (cfg.unfreeze.split(":")[0] in ("blocks", "fraction", "layer"), "unfreeze must be blocks:N, fraction:F or layer:NAME"),
    ]
    if "://" in cfg.out:
        raise UserError(f"--out: {cfg.out}: the run dir must be a local path (or a mounted shared folder); --data may be a URL")
    if cfg.data_service:
        from app.data.service import parse_address

        parse_address(cfg.data_service)
    for ok, message in checks:
        if not ok:
            raise UserError(f"config: {message}")
    return cfg


def save_config(cfg: TrainConfig, path: Path) -> None:
    write_text_atomic(path, json.dumps(cfg.to_dict(), indent=2, sort_keys=True) + "\n")


def read_saved_config(path: Path) -> TrainConfig:
    return TrainConfig(**json.loads(path.read_text()))
