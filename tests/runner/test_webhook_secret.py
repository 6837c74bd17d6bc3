"""The run command's webhook secret: generated once per install, kept under var/, printed."""

from __future__ import annotations

import stat

from runner.webhook_secret import FILE_NAME, WEBHOOK_PATH, webhook_env, webhook_secret


def test_generated_once_kept_under_var_and_printed(tmp_path):
    var = tmp_path / "var"
    env: dict[str, str] = {}
    line = webhook_env(var=var, environ=env, host="127.0.0.1", port="8000")
    secret = env["PAYMENTS_WEBHOOK_SECRET"]
    assert secret.startswith("whsec_") and len(secret) > 30
    assert line == f"webhook secret: {secret}"
    path = var / FILE_NAME
    assert path.read_text().strip() == secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # The simulator signs with the same secret and posts to the shop's endpoint.
    assert env["SIMULATOR_WEBHOOK_SECRET"] == secret
    assert env["SIMULATOR_WEBHOOK_URL"] == f"http://127.0.0.1:8000{WEBHOOK_PATH}"
    # A second start (same install) keeps it.
    again: dict[str, str] = {}
    assert webhook_env(var=var, environ=again, host="0.0.0.0", port="9000") == line
    assert again["PAYMENTS_WEBHOOK_SECRET"] == secret
    assert again["SIMULATOR_WEBHOOK_URL"] == f"http://127.0.0.1:9000{WEBHOOK_PATH}"
    # Another install gets another secret.
    other: dict[str, str] = {}
    webhook_env(var=tmp_path / "other", environ=other, host="127.0.0.1", port="8000")
    assert other["PAYMENTS_WEBHOOK_SECRET"] != secret


def test_the_environment_wins_and_is_not_printed(tmp_path):
    env = {"PAYMENTS_WEBHOOK_SECRET": "from-env"}
    line = webhook_env(var=tmp_path, environ=env, host="127.0.0.1", port="8000")
    assert env["PAYMENTS_WEBHOOK_SECRET"] == env["SIMULATOR_WEBHOOK_SECRET"] == "from-env"
    assert "from-env" not in line and line.startswith("webhook secret:")
    assert not (tmp_path / FILE_NAME).exists()
    assert webhook_secret(tmp_path, env) == ("from-env", "environment")
