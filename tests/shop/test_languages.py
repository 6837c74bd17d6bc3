"""The shop in two languages: French pages, the switcher, money per locale, the API in English.

The shopper's e-mails are written in the language the order was placed in.

Also the templates' and the French catalogue's completeness: every visible word of a
template is inside a translation tag, and every message of the catalogue is translated.
"""

from __future__ import annotations

import re
from decimal import Decimal
from html.parser import HTMLParser
from pathlib import Path

import pytest
from babel.messages.mofile import read_mo
from babel.messages.pofile import read_po
from django.conf import settings
from django.core import mail
from django.template import Engine
from django.template.base import Lexer, TokenType
from django.test import Client, override_settings
from django.utils import translation
from rest_framework.test import APIClient

from core.checks import shop_currency_is_iso
from core.money import UnknownCurrency, display_money, minor_units
from orders.event_types import OrderEventType
from orders.models import Order
from shop import emails
from shop.models import Mail
from tests.orders.conftest import ADDRESS

from .conftest import add_to_cart, checkout_form, order_id_of

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = ROOT / "locale" / "fr" / "LC_MESSAGES" / "django.po"
NBSP = "\xa0"


@pytest.fixture
def catalog(make_product):
    make_product("TEE-M", price="19.99", stock=8, name="T-shirt, size M")


# --- pages --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_browser_asking_for_french_gets_the_catalog_in_french(catalog):
    page = Client(headers={"accept-language": "fr"}).get("/")
    html = page.content.decode()
    assert page.status_code == 200 and page["Content-Language"] == "fr"
    assert '<html lang="fr">' in html
    assert "<h1>Catalogue</h1>" in html and "Se connecter" in html
    assert f"19,99{NBSP}€" in html and "En stock (8 disponibles)" in html
    assert "Log in" not in html and "In stock" not in html


@pytest.mark.django_db(transaction=True)
def test_english_stays_the_default_with_the_price_in_english(catalog):
    html = Client().get("/").content.decode()
    assert '<html lang="en">' in html and "<h1>Catalog</h1>" in html and "€19.99" in html


@pytest.mark.django_db(transaction=True)
def test_the_switcher_on_every_page_sets_the_language_and_returns_to_the_page(catalog):
    client = Client()
    html = client.get("/products/TEE-M/").content.decode()
    assert 'action="/i18n/setlang/"' in html
    assert 'name="language" value="fr" lang="fr"' in html and ">Français</button>" in html
    answer = client.post("/i18n/setlang/", {"language": "fr", "next": "/products/TEE-M/"})
    assert answer.status_code == 302 and answer["Location"] == "/products/TEE-M/"
    html = client.get("/products/TEE-M/").content.decode()
    assert (
        "Ajouter au panier" in html
        and 'value="fr" lang="fr" class="nav-button" aria-current' in html
    )
    client.post("/i18n/setlang/", {"language": "en", "next": "/"})
    assert "Add to cart" in client.get("/products/TEE-M/").content.decode()


@pytest.mark.django_db(transaction=True)
def test_form_labels_and_errors_are_french(catalog):
    client = Client(headers={"accept-language": "fr"})
    html = client.post("/products/TEE-M/", {"quantity": "x", "cart_version": "0"}).content.decode()
    assert "<label" in html and "Quantité</label>" in html
    assert "Saisissez un nombre entier." in html  # Django's own message, in French


@pytest.mark.django_db(transaction=True)
def test_a_french_checkout_places_the_order_its_total_read_back_as_sent(browser, catalog, provider):
    browser.cookies.load({settings.LANGUAGE_COOKIE_NAME: "fr"})
    add_to_cart(browser, "TEE-M", 2)
    form = checkout_form(browser)
    assert form["expected_total"] == "39.98"  # not "39,98": a value the form reads back
    placed = browser.post("/checkout/", form)
    assert placed.status_code == 303 and "/orders/" in placed["Location"]
    html = browser.get(placed["Location"]).content.decode()
    assert "Confirmée" in html and f"39,98{NBSP}€" in html


@pytest.mark.django_db(transaction=True)
def test_the_not_found_page_is_french():
    page = Client(headers={"accept-language": "fr"}).get("/products/NO-SUCH/")
    assert page.status_code == 404 and "<h1>Introuvable</h1>" in page.content.decode()


# --- the API stays in English ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("get", "/api/v1/loyalty/", None),  # 401: not authenticated
        ("post", "/api/v1/auth/token/", {}),  # 400: DRF's "This field is required."
        ("get", "/api/v1/no-such-thing/", None),  # 404
    ],
)
def test_the_api_answers_the_same_whatever_the_language_asked(method, path, body):
    english = getattr(Client(), method)(path, body, content_type="application/json")
    french = getattr(Client(headers={"accept-language": "fr"}), method)(
        path, body, content_type="application/json"
    )
    assert english.status_code == french.status_code >= 400
    assert english.content == french.content
    assert english.json()["title"] == french.json()["title"]
    assert "Content-Language" not in french
    assert "Accept-Language" not in french.get("Vary", "")


# --- money per locale ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("language", "currency", "amount", "shown"),
    [
        ("en", "EUR", "19.99", "€19.99"),
        ("fr", "EUR", "19.99", f"19,99{NBSP}€"),
        ("en", "JPY", "1500", "¥1,500"),
        ("fr", "KWD", "1.250", f"1,250{NBSP}KWD"),
    ],
)
def test_money_is_written_the_way_each_language_writes_it(language, currency, amount, shown):
    with translation.override(language):
        assert display_money(Decimal(amount), currency) == shown


@pytest.mark.parametrize(("currency", "places"), [("EUR", 2), ("JPY", 0), ("KWD", 3), ("CLF", 4)])
def test_minor_units_come_from_babel_for_any_iso_currency(currency, places):
    assert minor_units(currency) == places


@pytest.mark.parametrize("currency", ["XYZ", "eur", "EURO", ""])
def test_an_unknown_currency_is_an_error_not_two_places(currency):
    with pytest.raises(UnknownCurrency):
        minor_units(currency or "???")


@pytest.mark.parametrize(
    ("amount", "currency", "refused"),
    [("1.234", "KWD", False), ("1500", "JPY", False), ("1.5", "JPY", True), ("1", "XYZ", True)],
)
def test_the_payment_simulator_takes_minor_units_from_babel_too(amount, currency, refused):
    from devtools.simulator.ledger import RequestError, parse_amount

    if refused:
        with pytest.raises(RequestError):
            parse_amount(amount, currency)
    else:
        assert parse_amount(amount, currency) == Decimal(amount)


@pytest.mark.parametrize(("currency", "errors"), [("EUR", 0), ("JPY", 0), ("XYZ", 1), ("eur", 1)])
def test_shop_currency_is_checked_at_start(currency, errors):
    with override_settings(SHOP_CURRENCY=currency):
        found = shop_currency_is_iso(None)
    assert len(found) == errors
    assert all(error.id == "core.E001" for error in found)


# --- every visible word of a template is translated -------------------------------


def template_files() -> list[Path]:
    """The project's templates (each app's and templates/), pages and e-mails alike."""
    roots = [ROOT / "templates", *sorted(ROOT.glob("*/templates"))]
    return sorted(p for root in roots for p in root.rglob("*") if p.suffix in (".html", ".txt"))


# What may stand outside a translation tag: no letter at all (punctuation, symbols,
# digits, entities), e.g. " · ", "×", "(", ":".
_LETTER = re.compile(r"[^\W\d_]")
_VISIBLE_ATTRIBUTES = ("title", "alt", "placeholder", "aria-label", "data-label", "value")
_HIDDEN_ELEMENTS = ("script", "style")
_MARK = "\x00"  # where a tag, a variable or a translated block stood


class _VisibleText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.texts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag, attrs):
        if tag in _HIDDEN_ELEMENTS:
            self._hidden += 1
        kinds = dict(attrs).get("type")
        for name, value in attrs:
            if name in _VISIBLE_ATTRIBUTES and value:
                if name == "value" and (tag != "input" or kinds not in ("submit", "button")):
                    continue
                self.texts.append(value)

    def handle_endtag(self, tag):
        if tag in _HIDDEN_ELEMENTS:
            self._hidden -= 1

    def handle_data(self, data):
        if not self._hidden:
            self.texts.append(data)


def untranslated_text(source: str) -> list[str]:
    """Words of a template outside {% translate %} / {% blocktranslate %} and comments."""
    kept: list[str] = []
    depth = 0  # inside blocktranslate or comment
    for token in Lexer(source).tokenize():
        if token.token_type == TokenType.BLOCK:
            name = token.contents.split()[0] if token.contents else ""
            if name in ("blocktranslate", "blocktrans", "comment"):
                depth += 1
            elif name in ("endblocktranslate", "endblocktrans", "endcomment"):
                depth -= 1
            kept.append(_MARK)
        elif token.token_type == TokenType.TEXT and not depth:
            kept.append(token.contents)
        else:
            kept.append(_MARK)
    parser = _VisibleText()
    parser.feed("".join(kept))
    parser.close()
    words = (text.replace(_MARK, " ").strip() for text in parser.texts)
    return [word for word in words if _LETTER.search(word)]


def test_the_checker_finds_a_word_outside_a_tag_and_accepts_marked_text():
    assert untranslated_text("<p>Hello</p>") == ["Hello"]
    assert untranslated_text('<nav aria-label="Main"></nav>') == ["Main"]
    assert untranslated_text("{% load i18n %}<p>{% translate 'Hello' %} · (1)</p>") == []
    marked = "{% load i18n %}<p>{% blocktranslate %}Hi {{ name }}{% endblocktranslate %}</p>"
    assert untranslated_text(marked) == []
    assert untranslated_text('<script src="x.js">var words = 1;</script>') == []


@pytest.mark.parametrize("path", template_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_template_has_no_visible_text_outside_a_translation_tag(path):
    source = path.read_text()
    Engine.get_default().from_string(source)  # and it still compiles
    assert untranslated_text(source) == [], f"{path.relative_to(ROOT)}: mark these for translation"


# --- the French catalogue is complete -------------------------------------------------


def test_the_french_catalogue_has_no_untranslated_or_fuzzy_message():
    with CATALOGUE.open("rb") as fh:
        catalogue = read_po(fh, locale="fr")
    untranslated = [
        message.id
        for message in catalogue
        if message.id
        and (
            message.fuzzy
            or not message.string
            or (isinstance(message.string, tuple) and not all(message.string))
        )
    ]
    assert untranslated == []
    assert len(catalogue) > 300


def _key(message) -> tuple:
    ids = message.id if isinstance(message.id, (list, tuple)) else (message.id,)
    return (message.context, *ids)


def _text(message) -> tuple:
    strings = message.string if isinstance(message.string, (list, tuple)) else (message.string,)
    return tuple(strings)


def test_the_compiled_french_catalogue_matches_its_source():
    with CATALOGUE.open("rb") as fh:
        source = {_key(m): _text(m) for m in read_po(fh, locale="fr") if m.id}
    with CATALOGUE.with_suffix(".mo").open("rb") as fh:
        compiled = {_key(m): _text(m) for m in read_mo(fh) if m.id}
    assert compiled == source, "run `make messages` (compilemessages) and commit the .mo"


# --- the shopper's e-mails in the language the order was placed in -------------------


def _place(browser, language: str) -> Order:
    browser.cookies.load({settings.LANGUAGE_COOKIE_NAME: language})
    add_to_cart(browser, "TEE-M", 1)
    placed = browser.post("/checkout/", checkout_form(browser))
    assert placed.status_code == 303, placed.content
    return Order.objects.get(id=order_id_of(placed))


def _mail_of(order: Order) -> Mail:
    payload = {"number": order.number, "owner_id": order.owner_id, "total": "19.99"}
    payload |= {"currency": "EUR", "lines": []}
    emails.email_apply(
        message_id=f"confirmed-{order.number}",
        event_type=OrderEventType.CONFIRMED,
        payload=payload,
    )
    return Mail.objects.get(message_id=f"confirmed-{order.number}")


@pytest.mark.django_db(transaction=True)
def test_an_order_placed_in_french_gets_french_mails_an_english_one_english(
    browser, catalog, provider, monkeypatch
):
    monkeypatch.setattr(emails, "mails_ring", lambda ids, **_: None)  # we send them below
    french, english = _place(browser, "fr"), _place(browser, "en")
    assert (french.language, english.language) == ("fr", "en")
    mails = [_mail_of(french), _mail_of(english)]
    # The sender renders in a worker, where English (LANGUAGE_CODE) is active.
    assert emails.mails_send(mail_ids=[m.pk for m in mails]).summary() == "sent:2"
    subjects = {message.subject: message for message in mail.outbox}
    assert set(subjects) == {
        f"Votre commande {french.number} est confirmée",
        f"Your order {english.number} is confirmed",
    }
    french_mail = subjects[f"Votre commande {french.number} est confirmée"]
    assert "Bonjour" in french_mail.body and f"19,99{NBSP}€" in french_mail.body
    assert "Hello" in subjects[f"Your order {english.number} is confirmed"].body
    # The wrong twin: rendered in LANGUAGE_CODE (no order's language), the French
    # shopper's mail is English.
    twin = emails.mail_message(mails[0], language=settings.LANGUAGE_CODE)
    assert twin.subject == f"Your order {french.number} is confirmed"


@pytest.mark.django_db(transaction=True)
def test_an_api_order_is_placed_in_english_whatever_the_language_asked(catalog, shopper, provider):
    client = APIClient(headers={"accept-language": "fr"})
    client.force_authenticate(shopper)
    answer = client.post(
        "/api/v1/orders/",
        {
            "lines": [{"sku": "TEE-M", "quantity": 1}],
            "payment_method": "pm_card_ok",
            "shipping_address": ADDRESS,
        },
        format="json",
        HTTP_IDEMPOTENCY_KEY="api-in-french",
    )
    assert answer.status_code in (201, 202), answer.content
    order_id = answer.json().get("id") or answer.json()["order_id"]
    assert Order.objects.get(id=order_id).language == settings.LANGUAGE_CODE == "en"
