"""The storefront's forms. Labels are the contract's accessible names (http-api.md, Storefront).

Labels, help and errors are translated: lazily where a class defines them, at once
where a form's __init__ or clean makes them (docs/storefront.md, "Languages")."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import cast

from django import forms
from django.conf import settings
from django.contrib.auth import forms as auth_forms
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django_countries import countries

from orders.states import OnShortage

PAYMENT_METHODS = (
    ("pm_card_ok", gettext_lazy("Test card: approved")),
    ("pm_card_declined", gettext_lazy("Test card: declined")),
    ("pm_card_timeout", gettext_lazy("Test card: answer lost (payment pending, settled later)")),
    (
        "pm_card_unavailable",
        gettext_lazy("Test card: provider briefly unavailable (settled later)"),
    ),
)


def _shortage_choices() -> tuple[tuple[str, str], ...]:
    minutes = max(1, round(getattr(settings, "ORDER_RESERVATION_TTL_SECONDS", 900) / 60))
    return (
        (OnShortage.REJECT, _("Don't place the order")),
        (OnShortage.PARTIAL, _("Send what is available, charge only that")),
        (
            OnShortage.ASK,
            _("Ask me first (available items are held for {minutes} minutes)").format(
                minutes=minutes
            ),
        ),
    )


PASSWORD_HELP = gettext_lazy("At least 8 characters, not only digits, not a common password.")


def country_choices() -> list[tuple[str, str]]:
    """ISO 3166-1 countries (django-countries), by name; the value is the two-letter code."""
    return [("", _("Choose a country")), *((code, name) for code, name in countries)]


class Accessible:
    """Ties each field's help and errors to it with aria-describedby; aria-invalid on errors.

    A mixin, so that Django's own auth forms (password reset and change) get it too.
    """

    fields: dict
    _errors: dict | None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._describe()

    def _describe(self) -> None:
        """Point each field with help at it (again after a subclass changed the help)."""
        for name, field in self.fields.items():
            if field.help_text:
                field.widget.attrs["aria-describedby"] = f"id_{name}_help"
            elif field.widget.attrs.get("aria-describedby") == f"id_{name}_help":
                del field.widget.attrs["aria-describedby"]

    def add_error(self, field, error) -> None:
        super().add_error(field, error)  # type: ignore[misc]
        # Tie each field's errors to it (the template renders them as id_<name>_error).
        # Not self.errors, which would clean the form.
        for name in list(self._errors or ()):
            if name in self.fields:
                widget = self.fields[name].widget
                widget.attrs["aria-invalid"] = "true"
                ids = widget.attrs.get("aria-describedby", "").split()
                if f"id_{name}_error" not in ids:
                    ids.append(f"id_{name}_error")
                widget.attrs["aria-describedby"] = " ".join(ids)


class AccessibleForm(Accessible, forms.Form):
    """A storefront form (see Accessible)."""


class QuantityForm(AccessibleForm):
    quantity = forms.IntegerField(
        label=gettext_lazy("Quantity"), min_value=1, max_value=1000, initial=1
    )


class CheckoutForm(AccessibleForm):
    name = forms.CharField(
        label=gettext_lazy("Name"), max_length=200, widget=forms.TextInput({"autocomplete": "name"})
    )
    line1 = forms.CharField(
        label=gettext_lazy("Address"),
        max_length=200,
        widget=forms.TextInput({"autocomplete": "address-line1"}),
    )
    city = forms.CharField(
        label=gettext_lazy("City"),
        max_length=100,
        widget=forms.TextInput({"autocomplete": "address-level2"}),
    )
    postal_code = forms.CharField(
        label=gettext_lazy("Postal code"),
        max_length=20,
        widget=forms.TextInput({"autocomplete": "postal-code"}),
    )
    country = forms.ChoiceField(
        label=gettext_lazy("Country"),
        choices=(),
        error_messages={
            "required": gettext_lazy("Choose the country to ship to."),
            "invalid_choice": gettext_lazy("Choose a country from the list."),
        },
        widget=forms.Select({"autocomplete": "country"}),
    )
    payment_method = forms.ChoiceField(
        label=gettext_lazy("Payment method"), choices=PAYMENT_METHODS
    )
    on_shortage = forms.ChoiceField(
        label=gettext_lazy("If some items are short"),
        choices=(),
        initial=OnShortage.REJECT,
    )
    expected_total = forms.CharField(widget=forms.HiddenInput, required=False)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["on_shortage"]).choices = _shortage_choices()
        cast(forms.ChoiceField, self.fields["country"]).choices = country_choices()
        if self.is_bound and isinstance(self.data.get("country"), str):
            # An address typed before the list (or by a script): " de " is DE.
            data = dict(self.data.items())
            data["country"] = data["country"].strip().upper()
            self.data = data

    def clean_expected_total(self) -> Decimal | None:
        value = self.cleaned_data.get("expected_total") or ""
        if not value:
            return None
        try:
            return Decimal(value)
        except InvalidOperation:
            raise forms.ValidationError(_("The total shown was not a number.")) from None

    def shipping_address(self) -> dict:
        data = self.cleaned_data
        return {key: data[key] for key in ("name", "line1", "city", "postal_code", "country")}


class SignupForm(AccessibleForm):
    username = forms.CharField(
        label=gettext_lazy("Username"),
        max_length=150,
        widget=forms.TextInput({"autocomplete": "username"}),
    )
    email = forms.EmailField(
        label=gettext_lazy("Email"), widget=forms.EmailInput({"autocomplete": "email"})
    )
    password = forms.CharField(
        label=gettext_lazy("Password"),
        help_text=PASSWORD_HELP,
        widget=forms.PasswordInput({"autocomplete": "new-password"}),
    )


class ReturnForm(AccessibleForm):
    """A "Quantity" per shipped line (`quantity_<line id>`, 0 to what shipped) and a reason.

    What may still be returned (not already returned or in another return) is
    decided by the service under the order's lock, not here.
    """

    reason = forms.CharField(
        label=gettext_lazy("Reason"),
        max_length=500,
        required=False,
        widget=forms.Textarea({"rows": 3}),
    )

    def __init__(self, *args, lines=(), **kwargs) -> None:
        self.lines = list(lines)  # [(order line, name, returnable now)]
        quantities = {}
        for line, name, returnable in self.lines:
            quantities[f"quantity_{line.id}"] = forms.IntegerField(
                label=_("Quantity"),
                min_value=0,
                max_value=line.quantity_shipped,
                initial=0,
                error_messages={
                    "max_value": _("At most {shipped} of {name} shipped.").format(
                        shipped=line.quantity_shipped, name=name
                    ),
                    "min_value": _("Enter 0 or more."),
                    "invalid": _("Enter a whole number."),
                },
                widget=forms.NumberInput(
                    {
                        "min": "0",
                        "max": str(returnable),
                        "inputmode": "numeric",
                        "class": "quantity",
                        "aria-describedby": f"item_{line.id}",
                    }
                ),
            )
        super().__init__(*args, **kwargs)
        self.fields = {**quantities, **self.fields}

    def rows(self):
        """(line, name, returnable, bound field) per shipped line, for the template."""
        return [
            (line, name, returnable, self[f"quantity_{line.id}"])
            for line, name, returnable in self.lines
        ]

    def clean(self):
        data = super().clean()
        assert data is not None  # Form.clean returns cleaned_data
        if not self.errors and not any(
            data.get(f"quantity_{line.id}") for line, _name, _r in self.lines
        ):
            raise forms.ValidationError(_("Enter how many of at least one item you send back."))
        return data

    def return_lines(self) -> list[tuple[str, int]]:
        """(sku, quantity) of each line with a quantity above 0."""
        data = self.cleaned_data
        return [
            (line.sku, data[f"quantity_{line.id}"])
            for line, _name, _returnable in self.lines
            if data.get(f"quantity_{line.id}")
        ]


class PasswordResetForm(Accessible, auth_forms.PasswordResetForm):
    """Step 1 of the reset: "Email". Django's form: the same page whether or not an
    account has that address (no one learns who shops here), mail only to active
    accounts with a usable password."""


class SetPasswordForm(Accessible, auth_forms.SetPasswordForm):
    """Step 3 of the reset (from the e-mailed link): "Password" and "Confirm password"."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["new_password1"].label = _("Password")
        self.fields["new_password1"].help_text = PASSWORD_HELP
        self.fields["new_password2"].label = _("Confirm password")
        self.fields["new_password2"].help_text = ""
        self._describe()


class PasswordChangeForm(Accessible, auth_forms.PasswordChangeForm):
    """`/accounts/password-change/`: "Current password", "New password", "Confirm new password"."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["old_password"].label = _("Current password")
        self.fields["old_password"].widget.attrs.pop("autofocus", None)
        self.fields["new_password1"].label = _("New password")
        self.fields["new_password1"].help_text = PASSWORD_HELP
        self.fields["new_password2"].label = _("Confirm new password")
        self.fields["new_password2"].help_text = ""
        self._describe()


class EmailChangeForm(AccessibleForm):
    """The account page's e-mail change: the new address and the current password (an
    e-mail address is where a password reset goes, so changing it proves who asks)."""

    email = forms.EmailField(
        label=gettext_lazy("Email"),
        max_length=254,
        widget=forms.EmailInput({"autocomplete": "email"}),
    )
    current_password = forms.CharField(
        label=gettext_lazy("Current password"),
        strip=False,
        widget=forms.PasswordInput({"autocomplete": "current-password"}),
    )

    def __init__(self, *args, user, **kwargs) -> None:
        self.user = user
        super().__init__(*args, **kwargs)

    def clean_current_password(self) -> str:
        password = self.cleaned_data["current_password"]
        if not self.user.check_password(password):
            raise forms.ValidationError(_("That is not your current password."))
        return password

    def clean_email(self) -> str:
        email = self.cleaned_data["email"].strip()
        if email.lower() == (self.user.email or "").lower():
            raise forms.ValidationError(_("That is already your e-mail address."))
        return email
