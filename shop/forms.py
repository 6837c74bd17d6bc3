"""The storefront's forms. Labels are the contract's accessible names (http-api.md, Storefront)."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import cast

from django import forms
from django.conf import settings

from orders.states import OnShortage

PAYMENT_METHODS = (
    ("pm_card_ok", "Test card: approved"),
    ("pm_card_declined", "Test card: declined"),
    ("pm_card_timeout", "Test card: answer lost (payment pending, settled later)"),
    ("pm_card_unavailable", "Test card: provider briefly unavailable (settled later)"),
)


def _shortage_choices() -> tuple[tuple[str, str], ...]:
    minutes = max(1, round(getattr(settings, "ORDER_RESERVATION_TTL_SECONDS", 900) / 60))
    return (
        (OnShortage.REJECT, "Don't place the order"),
        (OnShortage.PARTIAL, "Send what is available, charge only that"),
        (OnShortage.ASK, f"Ask me first (available items are held for {minutes} minutes)"),
    )


class AccessibleForm(forms.Form):
    """Ties each field's help and errors to it with aria-describedby; aria-invalid on errors."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for name, field in self.fields.items():
            described = []
            if field.help_text:
                described.append(f"id_{name}_help")
            if described:
                field.widget.attrs["aria-describedby"] = " ".join(described)

    def add_error(self, field, error) -> None:
        super().add_error(field, error)
        # Tie each field's errors to it (the template renders them as id_<name>_error).
        # Not self.errors, which would clean the form; the stubs omit _errors.
        for name in list(self._errors or ()):  # type: ignore[attr-defined]
            if name in self.fields:
                widget = self.fields[name].widget
                widget.attrs["aria-invalid"] = "true"
                ids = widget.attrs.get("aria-describedby", "").split()
                if f"id_{name}_error" not in ids:
                    ids.append(f"id_{name}_error")
                widget.attrs["aria-describedby"] = " ".join(ids)


class QuantityForm(AccessibleForm):
    quantity = forms.IntegerField(label="Quantity", min_value=1, max_value=1000, initial=1)


class CheckoutForm(AccessibleForm):
    name = forms.CharField(
        label="Name", max_length=200, widget=forms.TextInput({"autocomplete": "name"})
    )
    line1 = forms.CharField(
        label="Address",
        max_length=200,
        widget=forms.TextInput({"autocomplete": "address-line1"}),
    )
    city = forms.CharField(
        label="City", max_length=100, widget=forms.TextInput({"autocomplete": "address-level2"})
    )
    postal_code = forms.CharField(
        label="Postal code",
        max_length=20,
        widget=forms.TextInput({"autocomplete": "postal-code"}),
    )
    country = forms.RegexField(
        label="Country",
        regex=r"^\s*[A-Za-z]{2}\s*$",
        max_length=2,
        help_text="Two-letter country code, for example DE or FR.",
        error_messages={"invalid": "Enter a two-letter country code, for example DE."},
        widget=forms.TextInput({"autocomplete": "country", "size": "3"}),
    )
    payment_method = forms.ChoiceField(label="Payment method", choices=PAYMENT_METHODS)
    on_shortage = forms.ChoiceField(
        label="If some items are short",
        choices=(),
        initial=OnShortage.REJECT,
    )
    expected_total = forms.CharField(widget=forms.HiddenInput, required=False)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["on_shortage"]).choices = _shortage_choices()

    def clean_country(self) -> str:
        return self.cleaned_data["country"].strip().upper()

    def clean_expected_total(self) -> Decimal | None:
        value = self.cleaned_data.get("expected_total") or ""
        if not value:
            return None
        try:
            return Decimal(value)
        except InvalidOperation:
            raise forms.ValidationError("The total shown was not a number.") from None

    def shipping_address(self) -> dict:
        data = self.cleaned_data
        return {key: data[key] for key in ("name", "line1", "city", "postal_code", "country")}


class SignupForm(AccessibleForm):
    username = forms.CharField(
        label="Username", max_length=150, widget=forms.TextInput({"autocomplete": "username"})
    )
    email = forms.EmailField(label="Email", widget=forms.EmailInput({"autocomplete": "email"}))
    password = forms.CharField(
        label="Password",
        help_text="At least 8 characters, not only digits, not a common password.",
        widget=forms.PasswordInput({"autocomplete": "new-password"}),
    )


class ReturnForm(AccessibleForm):
    """A "Quantity" per shipped line (`quantity_<line id>`, 0 to what shipped) and a reason.

    What may still be returned (not already returned or in another return) is
    decided by the service under the order's lock, not here.
    """

    reason = forms.CharField(
        label="Reason",
        max_length=500,
        required=False,
        widget=forms.Textarea({"rows": 3}),
    )

    def __init__(self, *args, lines=(), **kwargs) -> None:
        self.lines = list(lines)  # [(order line, name, returnable now)]
        quantities = {}
        for line, name, returnable in self.lines:
            quantities[f"quantity_{line.id}"] = forms.IntegerField(
                label="Quantity",
                min_value=0,
                max_value=line.quantity_shipped,
                initial=0,
                error_messages={
                    "max_value": f"At most {line.quantity_shipped} of {name} shipped.",
                    "min_value": "Enter 0 or more.",
                    "invalid": "Enter a whole number.",
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
            raise forms.ValidationError("Enter how many of at least one item you send back.")
        return data

    def return_lines(self) -> list[tuple[str, int]]:
        """(sku, quantity) of each line with a quantity above 0."""
        data = self.cleaned_data
        return [
            (line.sku, data[f"quantity_{line.id}"])
            for line, _name, _returnable in self.lines
            if data.get(f"quantity_{line.id}")
        ]
