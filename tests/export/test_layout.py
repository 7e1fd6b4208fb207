"""Which folder a command is pointed at: `photoclf serve` takes a run dir as predict does."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import UserError
from app.export.layout import SAVED_MODEL_FILE, served_model_folder


def _run_with_versions(root: Path, name: str, *versions: int) -> Path:
    """A run dir whose export/NAME holds these versions (their saved_model.pb is all that is read)."""
    for version in versions:
        folder = root / "export" / name / str(version)
        folder.mkdir(parents=True)
        (folder / SAVED_MODEL_FILE).write_bytes(b"")
    return root


def test_serve_takes_a_model_folder_as_it_is_and_a_run_dir_as_its_exported_model(tmp_path: Path):
    run = _run_with_versions(tmp_path / "runs" / "pets", "pets", 1, 2)
    assert served_model_folder(run / "export" / "pets") == run / "export" / "pets"
    assert served_model_folder(run) == run / "export" / "pets"  # said "no version folders" before


def test_a_version_folder_is_refused_naming_the_model_folder_that_holds_the_versions(tmp_path: Path):
    run = _run_with_versions(tmp_path / "run", "pets", 3)
    with pytest.raises(UserError, match=f"^{run / 'export' / 'pets' / '3'} is one version; serve its model folder"):
        served_model_folder(run / "export" / "pets" / "3")


def test_a_run_dir_with_nothing_exported_is_refused_saying_what_to_give(tmp_path: Path):
    (tmp_path / "run" / "export").mkdir(parents=True)
    with pytest.raises(UserError, match="no SavedModel found"):
        served_model_folder(tmp_path / "run")
    with pytest.raises(UserError, match="no such model folder"):
        served_model_folder(tmp_path / "missing")


def test_a_run_dir_whose_training_was_stopped_says_that_training_again_resumes_it(tmp_path: Path):
    from app.export.layout import resolve_model_dir

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")  # what a run dir holds from its first epoch on
    said = f"^{run}: a run dir with no export yet .* the same photoclf train command resumes it"
    for resolve in (resolve_model_dir, served_model_folder):  # evaluate, predict, review; serve
        with pytest.raises(UserError, match=said):
            resolve(run)


def test_an_export_dir_of_one_model_is_that_model_and_of_several_names_them(tmp_path: Path):
    """`runs/pets/export` is what a user sees after training; predict, evaluate and serve take it."""
    from app.export.layout import resolve_model_dir

    run = _run_with_versions(tmp_path / "run", "pets", 1, 2)
    assert resolve_model_dir(run / "export") == run / "export" / "pets" / "2"
    assert served_model_folder(run / "export") == run / "export" / "pets"
    _run_with_versions(run, "cats", 1)
    with pytest.raises(
        UserError, match=f"^{run / 'export'}: holds 2 models \\(cats, pets\\); give {run / 'export'}/<name>$"
    ):
        resolve_model_dir(run / "export")
    with pytest.raises(UserError, match=f"^{tmp_path / 'nowhere'}: no such run dir or export$"):
        resolve_model_dir(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "metadata, refused",
    [
        ({}, False),  # images only
        ({"side_features": [{"name": "age"}]}, True),  # exported before side_features_used existed: they are used
        ({"side_features": [{"name": "age"}], "side_features_used": True}, True),
        ({"side_features": [{"name": "age"}], "side_features_used": False}, False),  # left out: photos alone will do
    ],
)
def test_photo_files_are_refused_only_by_a_model_whose_answers_use_side_features(tmp_path: Path, metadata, refused):
    from app.export.layout import check_takes_photos_alone

    if refused:
        with pytest.raises(UserError, match=r"also takes side features \(age\), which image files do not carry"):
            check_takes_photos_alone(tmp_path, metadata)
    else:
        check_takes_photos_alone(tmp_path, metadata)
