"""The server stays small: importing it (and building the app) never imports the training or tuning stacks."""

from __future__ import annotations

import subprocess
import sys

from server.settings import Settings

HEAVY = ("torch", "smac", "nni", "ConfigSpace")


def test_importing_server_does_not_import_torch_smac_nni_or_configspace():
    code = (
        "import sys, server; from hpo.export import production; "
        "server.create_app(server.Settings(database_url='sqlite:////nonexistent/hpo.db')); "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_settings_come_from_the_environment_and_bind_localhost_by_default(monkeypatch):
    for name in ("HPO_API_HOST", "HPO_API_PORT", "HPO_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HPO_DATABASE_URL", "sqlite:////data/hpo.db")
    default = Settings()
    assert (default.api_host, default.api_port, default.token) == ("127.0.0.1", 8000, None)
    assert default.database_url == "sqlite:////data/hpo.db"
    monkeypatch.setenv("HPO_API_TOKEN", "abc")
    monkeypatch.setenv("HPO_API_PORT", "9001")
    configured = Settings()
    assert configured.token == "abc" and configured.api_port == 9001
    assert "abc" not in repr(configured)  # the token never shows in a repr or a log line
