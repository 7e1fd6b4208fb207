"""The export layout, owned here; every reader and writer of an export asks this module.

    EXPORT_DIR/NAME/VERSION/                 TF Serving's layout: numbered versions, newest served
        saved_model.pb, variables/
        assets/labels.txt                    app.labels format
        assets/metadata.json                 backbone, input size, classes, training metrics, LiteRT parity, ...,
                                             and every other file's size and SHA-256 ("files")
        litert/model_<mode>.tflite           float32 always (the CPU runtime); float16/int8 on request
        openvino/model.xml, model.bin        OpenVINO IR (decoded pixels in); its precision is chosen as it loads
        onnx/model.onnx                      ONNX (decoded pixels in), for ONNX Runtime and other ONNX tools
        MODEL_CARD.md, model_card.json       what the model is, what it was trained on, what was measured
    EXPORT_DIR/NAME-reports/                 evaluation reports of an export outside any run dir
    EXPORT_DIR/NAME/.incomplete-V-PID-*      an export being written by process PID (servers skip it;
                                             the next export removes it once PID is gone)

A run dir keeps its exports in RUN_DIR/export (see app.run_dir).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from app import storage
from app.errors import UserError
from app.labels import LABELS_FILE, read_labels

SAVED_MODEL_FILE = "saved_model.pb"
ASSETS = "assets"
METADATA_FILE = "metadata.json"
STAGING_PREFIX = ".incomplete-"
FILES_KEY = "files"


def staging_prefix(version: int) -> str:
    """The hidden folder an export is written in: it names its process, so an export killed
    midway (kill -9, a power cut) can be told from one still running."""
    return f"{STAGING_PREFIX}{version}-{os.getpid()}-"


def remove_abandoned_staging(model_dir: Path) -> list[Path]:
    """Remove the staging folders of exports whose process is gone; → those removed."""
    removed = []
    for folder in Path(model_dir).glob(f"{STAGING_PREFIX}*-*-*"):
        pid = folder.name[len(STAGING_PREFIX) :].split("-")[1]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def is_version_dir(path: Path) -> bool:
    return (Path(path) / SAVED_MODEL_FILE).is_file()


def versions(model_dir: Path) -> list[int]:
    """Complete versions under EXPORT_DIR/NAME, oldest first."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    return sorted(int(p.name) for p in model_dir.iterdir() if p.name.isdigit() and is_version_dir(p))


def served_versions(model_dir: Path) -> list[int]:
    """`versions`, or a UserError saying why a server could not start on `model_dir`. Needs no
    TensorFlow, so serve.py says it before spending seconds importing it."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise UserError(f"{model_dir}: no such model folder (expected EXPORT_DIR/<name> with version subfolders)")
    found = versions(model_dir)
    if not found:
        raise UserError(f"{model_dir}: no version folders holding a {SAVED_MODEL_FILE}")
    return found


def served_model_folder(path: Path) -> Path:
    """The model folder `photoclf serve` watches for versions: EXPORT_DIR/<name> as given, or a run
    dir's or an EXPORT_DIR's model (as `resolve_model_dir` finds it). A version folder is refused, naming
    its model folder: a server follows new versions, so it is given the folder that holds them."""
    path = Path(path)
    if is_version_dir(path):
        raise UserError(
            f"{path} is one version; serve its model folder {path.parent} (the newest version is served,"
            " and new ones are picked up)"
        )
    if path.is_dir() and not versions(path) and any(p.is_dir() for p in path.iterdir()):  # a run dir, EXPORT_DIR
        path = resolve_model_dir(path).parent
    served_versions(path)
    return path


def latest_version(model_dir: Path) -> Path | None:
    found = versions(model_dir)
    return Path(model_dir) / str(found[-1]) if found else None


def next_version(model_dir: Path) -> int:
    """One above every numbered folder, complete or not: a version number is never reused."""
    model_dir = Path(model_dir)
    taken = [int(p.name) for p in model_dir.iterdir() if p.name.isdigit()] if model_dir.is_dir() else []
    return max(taken, default=0) + 1


def version_dir(export_root: Path, name: str, version: int) -> Path:
    return Path(export_root) / name / str(version)


def reports_dir(version: Path) -> Path:
    """Where evaluation reports of an export go when it is not inside a run dir (beside the model
    folder: TF Serving only looks inside EXPORT_DIR/NAME)."""
    version = Path(version)
    return version.parent.parent / f"{version.parent.name}-reports"


def tflite_model_path(version: Path, mode: str) -> Path:
    """Inside the version folder, so a version's LiteRT files appear and disappear with it
    (TF Serving ignores the extra folder)."""
    return Path(version) / "litert" / f"model_{mode}.tflite"


def openvino_model_path(version: Path) -> Path:
    """The OpenVINO IR's .xml (its weights: the .bin beside it), inside the version folder."""
    return Path(version) / "openvino" / "model.xml"


def onnx_model_path(version: Path) -> Path:
    """The ONNX file, inside the version folder."""
    return Path(version) / "onnx" / "model.onnx"


def model_card_path(version: Path, kind: str) -> Path:
    """MODEL_CARD.md (kind "md") or model_card.json ("json"), at the top of the version folder."""
    return Path(version) / ("MODEL_CARD.md" if kind == "md" else "model_card.json")


def labels_path(version: Path) -> Path:
    return Path(version) / ASSETS / LABELS_FILE


def metadata_path(version: Path) -> Path:
    return Path(version) / ASSETS / METADATA_FILE


def read_classes(version: Path) -> list[str]:
    if not labels_path(version).exists():
        raise UserError(f"{version}: no {ASSETS}/{LABELS_FILE}; export it with photoclf export")
    return read_labels(labels_path(version))


def random_init_warning(metadata: dict) -> str | None:
    """The warning every place that answers with a model says where it was trained from random
    weights (no pretrained backbone could be had): its answers look like any other model's."""
    weights = str(metadata.get("weights") or "")
    if not weights.startswith("none"):
        return None
    return "this model was trained from random initialisation (no pretrained weights): expect poor answers"


def weights_for_readers(weights: str | None) -> str | None:
    """The backbone's weights as the card and a server's metadata show them: a file by its name,
    not its absolute path, since both are read by anyone who can reach the server and the
    training machine's folders are not theirs to read (the card's SHA-256 names the file)."""
    path, sep, source = str(weights).partition(" (from ")
    return f"{Path(path).name}{sep}{source}" if weights and Path(path).is_absolute() else weights


def read_metadata(version: Path) -> dict:
    path = metadata_path(version)
    return storage.read_json_object(path) if path.exists() else {}


def side_features_used(metadata: dict) -> bool:
    """Whether the model's answers use its side features: not where its run left them out (an
    export from before that choice was recorded uses them)."""
    return bool(metadata.get("side_features")) and metadata.get("side_features_used", True)


def check_takes_photos_alone(version: Path, metadata: dict | None = None) -> None:
    """Refuse photo files for a model whose answers use side features (files do not carry them; a
    run that left its side features out answers without them): read from metadata.json, so a
    command says so before TensorFlow's import."""
    metadata = read_metadata(version) if metadata is None else metadata
    if side_features_used(metadata):
        side = [c["name"] for c in metadata["side_features"]]
        raise UserError(
            f"{version} also takes side features ({', '.join(side)}), which image files do not carry;"
            " send them to the server's :predict, or evaluate TFRecords written with --feature-columns"
        )


def file_digests(version: Path) -> dict[str, dict]:
    """{relative path: {"bytes", "sha256"}} of every file of a version but its metadata.json (which
    holds this list): what a server checks before it swaps a version in."""
    version = Path(version)
    listed = {}
    for path in sorted(p for p in version.rglob("*") if p.is_file() and p != metadata_path(version)):
        listed[path.relative_to(version).as_posix()] = {"bytes": path.stat().st_size, "sha256": sha256_of(path)}
    return listed


def incomplete_file(version: Path, metadata: dict | None = None) -> str | None:
    """What is wrong with a version's files (one missing, cut short, changed, an asset missing),
    or None when they are as exported. A version exported without the list of files (before it
    existed, or not by photoclf) is checked for its assets only."""
    version = Path(version)
    try:
        metadata = read_metadata(version) if metadata is None else metadata
    except (ValueError, UserError):  # cut short or not UTF-8: still being copied, or damaged
        return f"{ASSETS}/{METADATA_FILE} cannot be read"
    for name, expected in (metadata.get(FILES_KEY) or {}).items():
        path = version / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != expected["bytes"]:
            return f"{name} has {size} of its {expected['bytes']} bytes"
        if sha256_of(path) != expected["sha256"]:
            return f"{name} differs from the file exported (SHA-256)"
    return missing_asset(version)


def missing_asset(version: Path) -> str | None:
    """An asset the SavedModel names (labels, metadata) that is not in its assets/: TensorFlow
    loads such a version and fails, or answers without its labels, only later."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel()
    try:
        saved_model.ParseFromString((Path(version) / SAVED_MODEL_FILE).read_bytes())
    except DecodeError:
        return f"{SAVED_MODEL_FILE} cannot be parsed (cut short?)"
    for meta_graph in saved_model.meta_graphs:
        for asset in meta_graph.asset_file_def:
            if not (Path(version) / ASSETS / asset.filename).is_file():
                return f"{ASSETS}/{asset.filename} is missing"
    return None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(2**20), b""):
            digest.update(block)
    return digest.hexdigest()


def resolve_model_dir(path: str | Path) -> Path:
    """A version folder as is; a model folder → its newest version; a run dir → the newest
    version of its first exported model; an EXPORT_DIR of one model → that model's newest."""
    from app.run_dir import RunDir

    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such run dir or export")
    if is_version_dir(path):
        return path
    export_root = RunDir(path).export_root
    models = sorted(p for p in export_root.iterdir() if p.is_dir()) if export_root.is_dir() else []
    for model_dir in [path, *models]:
        newest = latest_version(model_dir)
        if newest is not None:
            return newest
    exported = {p.name: latest_version(p) for p in sorted(path.iterdir()) if p.is_dir()} if path.is_dir() else {}
    exported = {name: newest for name, newest in exported.items() if newest is not None}
    if len(exported) == 1:
        return next(iter(exported.values()))
    if exported:
        raise UserError(f"{path}: holds {len(exported)} models ({', '.join(exported)}); give {path}/<name>")
    if RunDir(path).config.is_file():  # a run dir whose training was stopped before its export
        raise UserError(f"{path}: a run dir with no export yet (its training has not finished); the same"
                        " photoclf train command resumes it and exports")  # fmt: skip
    raise UserError(f"{path}: no SavedModel found (give EXPORT_DIR/<name>[/<version>] or a run dir with export/)")
