"""EMAIL_URL: one variable says where mail goes (config/settings/email_url.py)."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.settings.email_url import REPLACED, SMTP, email_settings, parse
from runner.supervisor import ENV
from tests.config.test_production_settings import FULL, _env, _run


def test_smtp_with_starttls_credentials_and_a_timeout():
    config = parse("smtp+tls://shop%40example.com:p%40ss:w@mail.example.com:2525?timeout=4")
    assert config.backend == SMTP
    assert (config.host, config.port) == ("mail.example.com", 2525)
    assert (config.user, config.password) == ("shop@example.com", "p@ss:w")
    assert (config.use_tls, config.use_ssl, config.timeout) == (True, False, 4.0)


def test_a_send_has_a_total_deadline_twice_the_timeout_unless_the_url_says():
    """`?deadline=` bounds one send in total (core.mail.SMTPBackend; a mail's lease covers it)."""
    assert (parse("smtp://mx").timeout, parse("smtp://mx").deadline) == (10.0, 20.0)
    assert parse("smtp://mx?timeout=4").deadline == 8.0
    assert parse("smtp://mx?timeout=4&deadline=30").deadline == 30.0
    assert (
        email_settings("console://", environ={"EMAIL_URL": "smtp://mx?deadline=12"})[
            "EMAIL_SEND_DEADLINE"
        ]
        == 12.0
    )
    with pytest.raises(ValueError, match="positive"):
        parse("smtp://mx?deadline=0")


@pytest.mark.parametrize(
    ("url", "port", "tls", "ssl"),
    [
        ("smtp://relay.internal", 25, False, False),
        ("smtp+tls://relay.internal", 587, True, False),
        ("smtp+ssl://relay.internal", 465, False, True),
        ("smtps://relay.internal", 465, False, True),
    ],
)
def test_each_smtp_scheme_has_its_port_and_encryption(url, port, tls, ssl):
    config = parse(url)
    assert (config.host, config.port, config.use_tls, config.use_ssl) == (
        "relay.internal",
        port,
        tls,
        ssl,
    )
    assert (config.user, config.password, config.timeout) == ("", "", 10.0)


def test_console_file_and_memory():
    assert parse("console://").backend.endswith(".console.EmailBackend")
    assert parse("locmem://").backend.endswith(".locmem.EmailBackend")
    folder = parse("file:///srv/shop/var/mail")
    assert folder.backend.endswith(".filebased.EmailBackend")
    assert folder.file_path == "/srv/shop/var/mail"


@pytest.mark.parametrize(
    "url", ["file://var/mail", "file:relative", "http://mail.example.com", "sendmail://x"]
)
def test_a_url_that_cannot_be_used_is_refused(url):
    with pytest.raises(ValueError, match="EMAIL_URL"):
        parse(url)


def test_settings_from_the_environment_or_the_default():
    assert email_settings("console://", environ={})["EMAIL_BACKEND"] == parse("console://").backend
    chosen = email_settings("console://", environ={"EMAIL_URL": "smtp://mx:2500"})
    assert (chosen["EMAIL_BACKEND"], chosen["EMAIL_HOST"], chosen["EMAIL_PORT"]) == (
        SMTP,
        "mx",
        2500,
    )
    assert email_settings("console://", environ={"EMAIL_URL": " "})["EMAIL_HOST"] == "localhost"
    with pytest.raises(ImproperlyConfigured, match="EMAIL_URL must start with"):
        email_settings("console://", environ={"EMAIL_URL": "mailto://x"})


@pytest.mark.parametrize("name", REPLACED)
def test_a_replaced_variable_still_set_stops_the_start_with_its_name(name):
    with pytest.raises(ImproperlyConfigured, match=f"^{name}: replaced by EMAIL_URL"):
        email_settings("console://", environ={name: "x", "EMAIL_URL": "console://"})


def test_make_run_writes_mail_to_var_mail():
    assert parse(ENV["EMAIL_URL"].format(var="/checkout/var")).file_path == "/checkout/var/mail"


_MAIL = [
    "-c",
    "import django, json; django.setup(); from django.conf import settings as s; print(json.dumps("
    "[s.EMAIL_BACKEND, s.EMAIL_HOST, s.EMAIL_PORT, s.EMAIL_USE_TLS, s.EMAIL_TIMEOUT]))",
]


def test_production_sends_by_smtp_on_localhost_by_default(tmp_path):
    env = _env(tmp_path, **FULL)
    env.pop("EMAIL_URL", None)
    out = _run(_MAIL, env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [SMTP, "localhost", 25, False, 10.0]


def test_production_reads_email_url(tmp_path):
    out = _run(_MAIL, _env(tmp_path, **FULL, EMAIL_URL="smtp+tls://u:p@smtp.example.com"))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [SMTP, "smtp.example.com", 587, True, 10.0]


def test_production_with_a_replaced_variable_stops_naming_it(tmp_path):
    out = _run(_MAIL, _env(tmp_path, **FULL, EMAIL_HOST="smtp.example.com"))
    assert out.returncode != 0
    assert "EMAIL_HOST: replaced by EMAIL_URL" in out.stderr, out.stderr
