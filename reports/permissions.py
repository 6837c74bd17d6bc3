"""The model permission reading the sales reports requires.

Reports are the one staff read that needs a permission: revenue and refunds
are business figures, not what every staff user (a warehouse scanner) sees
(docs/security.md "One permission map").
"""

from __future__ import annotations

VIEW_REPORTS = "reports.view_dailysalesreport"

STAFF_ACTIONS = {
    "read the daily sales reports": VIEW_REPORTS,
}
