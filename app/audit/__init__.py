"""Dataset audit: exact and near duplicates, leaks across splits, likely wrong labels, outliers.

`audit(data, report_dir)` returns every finding (see `app/audit/audit.py`); `scripts/audit.py`
writes them as audit.json, report.html and, on request, a review manifest for `photoclf convert`.
"""

from app.audit.audit import audit

__all__ = ["audit"]
