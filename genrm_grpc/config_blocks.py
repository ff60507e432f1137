"""The blocks of the server settings: ``judge:``, ``tls:``, ``auth:`` and ``tracing:``.

Declared, defaulted and validated here; ``genrm_grpc.config`` nests them in ``Settings``
(and re-exports every name, so importers use ``genrm_grpc.config``). The field lists are
the configuration table of the README; ``tests/test_settings_keys.py`` checks that
every key is read somewhere and documented.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FilePath,
    field_validator,
    model_validator,
)

# Every deadline must be finite and > 0: null, 0, negatives, NaN and ∞ are refused.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class ConfigError(Exception):
    """The configuration is invalid; the message is one line for the operator."""


class JudgeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = "http://127.0.0.1:8000"
    api: Literal["responses", "chat_completions"] = "responses"
    model: str = "genrm"
    max_output_tokens: Annotated[int, Field(gt=0)] | None = None
    temperature: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] | None = None
    #: Name of the environment variable holding the API key (never the key itself).
    api_key_env: str | None = None
    max_connections: Annotated[int, Field(ge=1)] = 64
    max_retry_sleep_s: Seconds = 30.0
    #: Larger judge response bodies fail that attempt like an unparseable answer.
    max_response_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024

    # --- the judge farm (docs/judge-farm.md)
    #: Several endpoints of the same model (``url`` is the one-endpoint spelling).
    urls: list[str] | None = None
    #: ``dns``: re-resolve the host of ``url`` every ``discovery_interval_s``; every
    #: A/AAAA record is one endpoint (a Kubernetes headless Service).
    discovery: Literal["static", "dns"] = "static"
    discovery_interval_s: Seconds = 10.0
    #: ``HOST:PORT`` of the DNS server to ask (None: the system resolver).
    discovery_nameserver: str | None = None
    #: Requests at once per endpoint (None: ``max_connections``).
    max_in_flight: Annotated[int, Field(ge=1)] | None = None
    #: ``affinity`` (default); ``round_robin``, ``hash``, ``least_loaded`` to compare.
    routing: Literal["affinity", "round_robin", "hash", "least_loaded"] = "affinity"
    #: Cohort affinity holds while the preferred endpoint stays within this × the mean.
    affinity_load_factor: Annotated[float, Field(ge=1, le=10, allow_inf_nan=False)] = 1.25
    outlier_consecutive_failures: Annotated[int, Field(ge=1)] = 5
    outlier_base_ejection_s: Seconds = 30.0
    outlier_max_ejection_s: Seconds = 300.0
    max_ejection_percent: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 50.0
    #: How often each endpoint's ``/v1/models`` is checked, and an ejected one probed.
    probe_interval_s: Seconds = 10.0
    #: Adaptive hedging (farms of two or more, unless ``judge_hedge_after_s`` is set):
    #: the hedge point is this quantile of the endpoint's latencies (None = off) ...
    hedge_quantile: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] | None = 0.99
    #: ... never below this many seconds ...
    hedge_floor_s: Seconds = 2.0
    #: ... once this many latencies are known.
    hedge_min_samples: Annotated[int, Field(ge=1)] = 32
    #: Scrape each endpoint's vLLM ``/metrics`` this often (None = off): an endpoint with
    #: requests waiting in its own queue gets no new request while another has none.
    scrape_metrics_s: Seconds | None = None

    # --- judge tokens (docs/judge-tokens.md)
    #: Learn how long converging verdicts run and cap each attempt's output budget at a
    #: high quantile of that, times a margin (never above max_output_tokens).
    adaptive_budget: bool = False
    adaptive_budget_quantile: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False)] = 0.99
    adaptive_budget_margin: Annotated[float, Field(ge=1, le=10, allow_inf_nan=False)] = 1.2
    adaptive_budget_floor: Annotated[int, Field(ge=1)] = 1024
    adaptive_budget_min_samples: Annotated[int, Field(ge=1, le=1024)] = 64
    #: Read the judge's answer as server-sent events (both wire formats): a node that
    #: sends no first token within first_token_timeout_s is hung, progress is visible,
    #: and closing the stream aborts the generation.
    stream: bool = False
    #: With ``stream``: no first generated token within this many seconds of sending the
    #: request treats the node as hung at once (None = only judge_request_timeout_s).
    first_token_timeout_s: Seconds | None = 60.0

    @field_validator("url")
    @classmethod
    def _url_is_http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            # Never echo the value: it may carry a password (user-info).
            raise ValueError("must start with http:// or https://")
        return value

    @field_validator("urls")
    @classmethod
    def _urls_are_http(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must name at least one endpoint")
        for k, url in enumerate(value):
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"entry {k} must start with http:// or https://")
        if len(set(value)) != len(value):
            raise ValueError("names an endpoint twice")
        return value

    @field_validator("discovery_nameserver")
    @classmethod
    def _nameserver(cls, value: str | None) -> str | None:
        return None if value is None else host_port(value, "judge.discovery_nameserver")

    @model_validator(mode="after")
    def _one_spelling(self) -> JudgeSettings:
        if self.urls is not None and "url" in self.model_fields_set:
            raise ValueError("set judge.url (one endpoint) or judge.urls (several), not both")
        if self.discovery == "dns" and self.urls is not None:
            raise ValueError("judge.discovery: dns resolves the host of judge.url; drop judge.urls")
        return self

    def endpoint_urls(self) -> tuple[str, ...]:
        """The configured endpoints (before any discovery)."""
        return tuple(self.urls) if self.urls is not None else (self.url,)

    def in_flight_per_endpoint(self) -> int:
        return self.max_in_flight if self.max_in_flight is not None else self.max_connections

    def api_key(self) -> str | None:
        if not self.api_key_env:
            return None
        value = os.environ.get(self.api_key_env)
        if not value:
            raise ConfigError(
                f"judge.api_key_env names {self.api_key_env!r}, but that variable is not set"
            )
        return value


def host_port(value: str, name: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{name} must be HOST:PORT, got {value!r}")
    return value


class TlsSettings(BaseModel):
    """Server TLS; mutual TLS when ``client_ca_file`` is set and ``require_client_auth``."""

    model_config = ConfigDict(extra="forbid")

    cert_file: FilePath
    key_file: FilePath
    #: PEM bundle of the CAs whose client certificates are accepted.
    client_ca_file: FilePath | None = None
    require_client_auth: bool = False

    @model_validator(mode="after")
    def _client_auth_needs_ca(self) -> TlsSettings:
        if self.require_client_auth and self.client_ca_file is None:
            raise ValueError("tls.require_client_auth needs tls.client_ca_file")
        return self


#: A principal named in a tokens file or variable: a short name without spaces or colons.
PRINCIPAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@/+=-]{0,127}")


def token_principal(token: str) -> str:
    """The stable principal of a token listed without a name: a hash, never the token."""
    return "token-" + hashlib.sha256(token.encode()).hexdigest()[:16]


class AuthSettings(BaseModel):
    """Bearer tokens accepted from clients, each naming a principal.

    A file holds one ``principal:token`` per line, an env var comma-separated
    ``principal:token`` entries. An entry without ``principal:`` (the old one-token
    format) belongs to the principal ``token-<16 hex digits of the token's SHA-256>``.
    Only where the tokens live is configuration; the tokens themselves never are, so they
    never end up in a YAML file, a flag, ``ps`` output or a log line.
    """

    model_config = ConfigDict(extra="forbid")

    tokens_file: FilePath | None = None
    tokens_env: str | None = None

    @model_validator(mode="after")
    def _one_source_with_tokens(self) -> AuthSettings:
        if (self.tokens_file is None) == (self.tokens_env is None):
            raise ValueError("auth needs exactly one of tokens_file and tokens_env")
        self.principals()  # fail at start-up, not at the first call
        return self

    def tokens(self) -> tuple[str, ...]:
        """The accepted tokens (read now, so a rotated file is picked up on restart)."""
        return tuple(self.principals())

    def principals(self) -> dict[str, str]:
        """Every accepted token → its principal (read now; errors never quote a token)."""
        if self.tokens_file is not None:
            try:
                text = pathlib.Path(self.tokens_file).read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(
                    f"cannot read auth.tokens_file {self.tokens_file}: {exc}"
                ) from None
            entries = [(f"line {n}", line.strip()) for n, line in enumerate(text.splitlines(), 1)]
            entries = [(w, e) for w, e in entries if e and not e.startswith("#")]
            source = f"auth.tokens_file {self.tokens_file}"
        else:
            assert self.tokens_env is not None
            raw = [t.strip() for t in os.environ.get(self.tokens_env, "").split(",")]
            entries = [(f"entry {n}", t) for n, t in enumerate(raw, 1) if t]
            source = f"auth.tokens_env {self.tokens_env!r}"
        if not entries:
            raise ValueError(f"{source} holds no token")
        principals: dict[str, str] = {}
        for where, entry in entries:
            name, sep, token = entry.partition(":")
            if not sep:
                name, token = token_principal(entry), entry
            elif not PRINCIPAL_NAME.fullmatch(name):
                raise ValueError(
                    f"{source} {where}: the principal before ':' must be 1-128 characters "
                    "of letters, digits and ._@/+=- (starting with a letter or digit)"
                )
            # Tokens travel in an HTTP/2 header: printable ASCII without spaces.
            if not token or not token.isascii() or not token.isprintable() or " " in token:
                raise ValueError(f"{source} {where}: tokens must be printable ASCII without spaces")
            if principals.setdefault(token, name) != name:
                raise ValueError(f"{source} {where}: the same token is listed for two principals")
        return principals


class TracingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    exporter: Literal["console", "otlp"] = "console"
