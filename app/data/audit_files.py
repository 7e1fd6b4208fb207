"""Where `photoclf audit` puts its report, and what a later step reads back from it: the photos
of a split with a copy in another split (a "leak": on such a test photo the model is asked what
it was trained on, so the split's accuracy says more than photos never seen would).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app import storage
from app.data import schema
from app.data.pipeline import load_dataset_info
from app.errors import UserError

JSON_FILE, HTML_FILE = "audit.json", "report.html"


def default_report_dir(data: str | Path) -> Path:
    """DATA's sibling: photos/ → photos-audit/, photos.csv → photos-audit/."""
    data = Path(data)
    return data.parent / f"{data.stem}-audit"


@dataclass(frozen=True)
class Leaked:
    names: frozenset[str]  # the photos' stored names (image/filename: the path under the source)
    audit: Path


def leaked_in(data_dir: str, split: str) -> Leaked | None:
    """`split`'s photos with an exact or near copy in another split, read from the audit of the
    TFRecord folder or of the photos it was converted from (each in its default place); None
    where neither exists or neither counts the dataset's photos per split and class (an audit
    of other data, or of this data before it was converted again with other fractions)."""
    if storage.is_url(data_dir):
        return None
    info = load_dataset_info(data_dir)
    source = storage.read_json_object(storage.join(data_dir, schema.METADATA_FILE)).get("source")
    for audited in [data_dir] + ([source] if isinstance(source, str) else []):
        path = default_report_dir(audited) / JSON_FILE
        try:
            found = storage.read_json_object(path) if path.is_file() else {}
            if found.get("counts") == info.counts:
                sides = [side for pair in found["leaks"] for side in (pair["a"], pair["b"])]
                return Leaked(frozenset(side["path"] for side in sides if side["split"] == split), path)
        except (OSError, UserError, KeyError, TypeError):  # unreadable, or not as the audit writes it
            continue
    return None
