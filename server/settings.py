"""The server's settings, read from the environment (pydantic-settings); `hpo serve` flags override them.

HPO_DATABASE_URL   the database (default: the embedded SQLite file ./.hpo/hpo.db, as for every `hpo` command)
HPO_API_HOST       the address to bind (default 127.0.0.1: only this machine can connect)
HPO_API_PORT       the port (default 8000)
HPO_API_TOKEN      the bearer token actions (stop an experiment) require; unset: actions are refused (403); printable
                   ASCII only (`hpo serve` refuses another character: a client's UTF-8 would never match it)
HPO_API_ACCESS_LOG one line per request on stdout (default 1; 0 turns it off, for a fifth more requests/s)
HPO_API_DATABASE_TIMEOUT_S  how long a quick read (the best config, a trial page, /health) waits for a database
                   server's answer before the request answers 503 (default 5; PostgreSQL: server/storage.py)
"""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from hpo.storage.engine import default_database_url


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HPO_", extra="ignore", frozen=True)

    database_url: str = Field(default_factory=default_database_url, description="SQLAlchemy URL of the database.")
    api_host: str = Field("127.0.0.1", description="Address to bind; 0.0.0.0 exposes the API to the network.")
    api_port: int = Field(8000, ge=1, le=65535, description="TCP port to listen on.")
    api_token: SecretStr | None = Field(None, description="Bearer token for actions; None refuses every action.")
    api_access_log: bool = Field(True, description="Log one line per request (uvicorn's access log).")
    api_database_timeout_s: float = Field(
        5.0, ge=2, le=3600, description="Seconds a quick read waits for the database server's answer (PostgreSQL)."
    )

    @field_validator("api_host")
    @classmethod
    def _named_host(cls, value: str) -> str:
        """An empty address would bind every interface (uvicorn passes it on as is): it must be said, 0.0.0.0."""
        if not value.strip():
            raise ValueError("an empty address binds every network interface: give 127.0.0.1 (this machine only) "
                             "or, to expose the API to the network, 0.0.0.0")  # fmt: skip
        return value.strip()

    @field_validator("api_token")
    @classmethod
    def _ascii_token(cls, value: SecretStr | None) -> SecretStr | None:
        """A client sends the token in an HTTP header, whose bytes are compared with the token's UTF-8: a character
        outside printable ASCII (é, a control character) would never match what a client sends. Said at startup,
        without the token."""
        text = value.get_secret_value().strip() if value is not None else ""
        bad = next((i for i, char in enumerate(text) if not " " <= char <= "~"), None)
        if bad is not None:
            raise ValueError(f"the token has a character that is not printable ASCII (its character {bad + 1}), "
                             "which no client can send in the Authorization header so that it matches: use ASCII "
                             "letters, digits and punctuation only, e.g. the output of "
                             "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")  # fmt: skip
        return value

    @property
    def token(self) -> str | None:
        """The action token, or None when none (or an empty one) is configured."""
        value = self.api_token.get_secret_value().strip() if self.api_token else ""
        return value or None
