"""The shopper's account: loyalty points and the purchase history read model."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from core.due import DuePolicy, DueWork, due_index


class LoyaltyAccount(models.Model):
    """One shopper's points, changed only by versioned conditional UPDATEs (shop.loyalty).

    `applied` is the list of event ids already applied, each `{"id", "at"}`
    with `at` on the database clock; it is trimmed by age, never by count,
    inside the same UPDATE that appends (see docs/events.md).
    """

    # The user is the primary key: insert-first creation costs no sequence value.
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        primary_key=True,
        on_delete=models.CASCADE,
        related_name="loyalty_account",
        verbose_name=_("user"),
    )
    balance = models.BigIntegerField(default=0, verbose_name=_("balance"))
    version = models.BigIntegerField(default=0, verbose_name=_("version"))
    applied = models.JSONField(default=list, verbose_name=_("applied"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    updated_at = models.DateTimeField(db_default=Now(), verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("loyalty account")
        verbose_name_plural = _("loyalty accounts")

    def __str__(self) -> str:
        return gettext("{user}: {balance} points (v{version})").format(
            user=self.user_id, balance=self.balance, version=self.version
        )


class LoyaltyOrder(models.Model):
    """What one order has earned and had reversed, for "a cancellation reverses what is left".

    Written only in the transaction of a successful versioned UPDATE of its
    account, so the account's version guards it too (shop.loyalty).
    """

    account = models.ForeignKey(
        LoyaltyAccount, on_delete=models.CASCADE, related_name="orders", verbose_name=_("account")
    )
    order_id = models.CharField(max_length=64, verbose_name=_("order id"))
    earned = models.BigIntegerField(default=0, verbose_name=_("earned"))
    reversed = models.BigIntegerField(default=0, verbose_name=_("reversed"))
    # The event that earned (a second earning event for the order earns nothing).
    earned_by = models.CharField(max_length=255, null=True, blank=True, verbose_name=_("earned by"))
    cancelled = models.BooleanField(default=False, verbose_name=_("cancelled"))

    class Meta:
        verbose_name = _("loyalty order")
        verbose_name_plural = _("loyalty orders")
        constraints = [
            models.UniqueConstraint(
                fields=["account", "order_id"], name="shop_loyaltyorder_account_order_uniq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.order_id}: +{self.earned} -{self.reversed}"


class PurchaseHistoryLine(models.Model):
    """One order line as the shopper sees it in their history, net of returns and cancellation.

    Fed by `shop.history.history_apply` under the inbox. `quantity` and
    `amount` are the net figures the API shows (0 → not shown); the parts
    they are computed from are kept so that events arriving out of order
    (a return before its confirmation) still net to the same result.
    """

    id = models.BigAutoField(primary_key=True, verbose_name=_("id"))
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="purchase_history",
        verbose_name=_("user"),
    )
    order_id = models.CharField(max_length=64, verbose_name=_("order id"))
    order_number = models.BigIntegerField(verbose_name=_("order number"))
    position = models.PositiveIntegerField(default=0, verbose_name=_("position"))
    sku = models.CharField(max_length=64, verbose_name=_("sku"))
    unit_price = models.DecimalField(max_digits=12, decimal_places=4, verbose_name=_("unit price"))
    currency = models.CharField(max_length=3, blank=True, default="", verbose_name=_("currency"))
    quantity_confirmed = models.PositiveIntegerField(
        default=0, verbose_name=_("quantity confirmed")
    )
    quantity_returned = models.PositiveIntegerField(default=0, verbose_name=_("quantity returned"))
    cancelled = models.BooleanField(default=False, verbose_name=_("cancelled"))
    quantity = models.PositiveIntegerField(default=0, verbose_name=_("quantity"))
    amount = models.DecimalField(
        max_digits=14, decimal_places=4, default=0, verbose_name=_("amount")
    )
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))

    class Meta:
        verbose_name = _("purchase history line")
        verbose_name_plural = _("purchase history lines")
        constraints = [
            models.UniqueConstraint(
                fields=["order_id", "sku"], name="shop_purchasehistoryline_order_sku_uniq"
            )
        ]
        indexes = [
            # The shopper's list: newest order first, lines in order.
            models.Index(
                fields=["user", "-order_number", "position"],
                name="shop_history_user_order_idx",
            )
        ]

    def __str__(self) -> str:
        return f"#{self.order_number} {self.sku} × {self.quantity}"


class Cart(models.Model):
    """One shopper's cart. `version` moves on with every change (a conditional UPDATE).

    The checkout form's request key is `checkout:<cart id>:<version>` (shop.checkout):
    one version of the cart is one order, whichever tab, back button or resubmitted
    form sends it. Lines change only in the transaction that moved the version.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="cart",
        verbose_name=_("user"),
    )
    version = models.BigIntegerField(default=0, verbose_name=_("version"))
    updated_at = models.DateTimeField(db_default=Now(), verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("cart")
        verbose_name_plural = _("carts")

    def __str__(self) -> str:
        return gettext("cart of {user} (v{version})").format(
            user=self.user_id, version=self.version
        )


class CartLine(models.Model):
    """One sku in a cart and the units wanted (1..1000, as an order line)."""

    cart = models.ForeignKey(
        Cart, on_delete=models.CASCADE, related_name="lines", verbose_name=_("cart")
    )
    sku = models.CharField(max_length=64, verbose_name=_("sku"))
    quantity = models.PositiveIntegerField(verbose_name=_("quantity"))
    added_at = models.DateTimeField(db_default=Now(), verbose_name=_("added at"))

    class Meta:
        verbose_name = _("cart line")
        verbose_name_plural = _("cart lines")
        constraints = [
            models.UniqueConstraint(fields=["cart", "sku"], name="shop_cartline_cart_sku_uniq"),
            models.CheckConstraint(
                condition=models.Q(quantity__gte=1, quantity__lte=1000),
                name="shop_cartline_quantity_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.sku} × {self.quantity}"


class Mail(DueWork):
    """One shopper e-mail, written by the e-mails consumer and sent later (due work, `core.due`).

    The consumer writes it in the batch's transaction, with the inbox claim
    and the delivery's `done_at`: the unique message id makes a copy of the
    event unable to write a second one. `shop.send_mail` sends it (an attempt
    leased by `core.due.attempt_begin`) and marks it done: `done_at` is when
    it was sent. At least once: a send whose mark did not commit is sent
    again after its attempt's lease. Past its budget it needs attention.
    """

    id = models.BigAutoField(primary_key=True, verbose_name=_("id"))
    # The outbox message it is the mail of (the consumer's inbox id).
    message_id = models.CharField(max_length=255, verbose_name=_("message id"))
    event_type = models.CharField(max_length=64, verbose_name=_("event type"))
    # The event's payload as the consumer read it: the templates' data, kept with the
    # row so that sending never needs the outbox message (purged after its retention).
    payload = models.JSONField(default=dict, verbose_name=_("payload"))
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        related_name="+",
        verbose_name=_("user"),
    )
    # The shopper's address when the event was applied.
    address = models.CharField(max_length=254, verbose_name=_("address"))
    created_at = models.DateTimeField(db_default=Now(), verbose_name=_("created at"))
    updated_at = models.DateTimeField(db_default=Now(), verbose_name=_("updated at"))

    class Meta:
        verbose_name = _("mail")
        verbose_name_plural = _("mails")
        constraints = [
            models.UniqueConstraint(fields=["message_id"], name="shop_mail_message_uniq"),
        ]
        indexes = [due_index(name="shop_mail_due_idx")]

    def __str__(self) -> str:
        return gettext("mail {id} {event_type} to {address}").format(
            id=self.id, event_type=self.event_type, address=self.address
        )

    @classmethod
    def due_policy(cls) -> DuePolicy:
        # One attempt is one send, and the send has a total deadline (EMAIL_SEND_DEADLINE:
        # core.mail.SMTPBackend bounds every socket operation by what is left of it), plus
        # the margin for the database around it. EMAIL_TIMEOUT bounds each operation only:
        # a slow, live relay outlasted a lease of twice it (docs/events.md, "Shopper e-mails").
        return DuePolicy.from_settings(
            "SHOP_MAIL",
            task="shop.send_mail",
            attempt_lease=float(settings.EMAIL_SEND_DEADLINE) + settings.DUE_ATTEMPT_MARGIN,
        )
