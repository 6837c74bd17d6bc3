"""Row locks of the payments app, in one place.

Order when more than one is needed: the payment first, then its
transactions and settlements, each in primary-key order.
"""

from __future__ import annotations

from .models import Payment


def payment_lock(*, payment_id) -> Payment:
    """Lock one payment row until the end of the current transaction and return it.

    Other areas use this too: a flow that must not miss a settlement which
    lands while it works (checkout writing `payment_pending`) locks the
    payment, then reads its status.
    """
    return Payment.objects.select_for_update(of=("self",)).get(id=payment_id)
