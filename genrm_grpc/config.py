"""One settings model for the server: YAML file, then env ``GENRM_*``, then flags.

Precedence (highest first): command-line flags, environment variables, the YAML file,
built-in defaults. Environment names are ``GENRM_<KEY>`` for top-level keys and
``GENRM_<BLOCK>__<KEY>`` for a block (e.g. ``GENRM_JUDGE__URL``). Unknown keys are
errors in every source (YAML keys, ``GENRM_*`` variables), so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import contextvars
import difflib
import hashlib
import os
import pathlib
import re
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FilePath,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from genrm_grpc.cohort.identity import MAX_GROUP_SIZE
from genrm_grpc.runtime.plan import PassPlan

# Every deadline must be finite and > 0: null, 0, negatives, NaN and ∞ are refused.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]

#: What a member held by a StreamGroups stream costs beyond its wire bytes (cohort entry,
#: waiter, digests): charged against the stream's and the connection's byte bounds.
STREAM_MEMBER_OVERHEAD_BYTES = 1024

DEFAULT_PRINCIPLE = (
    "The response should be helpful, relevant, accurate and complete, follow the user's "
    "instructions, and be clearly written."
)


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
        return None if value is None else _host_port(value, "judge.discovery_nameserver")

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


def _host_port(value: str, name: str) -> str:
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


_yaml_path: contextvars.ContextVar[pathlib.Path | None] = contextvars.ContextVar(
    "genrm_yaml_path", default=None
)


def _yaml_source(settings_cls: type[BaseSettings]) -> PydanticBaseSettingsSource | None:
    """pydantic-settings' own YAML source for ``--config``, with one-line errors.

    A named file must exist (the library would skip a missing one silently) and hold a
    mapping; unknown keys are then refused by ``extra="forbid"`` like any other.
    """
    path = _yaml_path.get()
    if path is None:
        return None
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        source = YamlConfigSettingsSource(settings_cls, yaml_file=path)
    except yaml.YAMLError as exc:
        message = f"config file {path} is not valid YAML: {exc}".replace("\n", " ")
        raise ConfigError(message) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except (AttributeError, TypeError, ValueError):  # the document is a list or a scalar
        raise ConfigError(f"config file {path} must hold a mapping at the top level") from None
    if not isinstance(source.yaml_data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    from genrm_grpc import gym_config  # a NeMo Gym file: convert it as `config from-gym` does

    if gym_config.is_gym_config(source.yaml_data):
        converted = gym_config.for_serve(source.yaml_data, path)
        return InitSettingsSource(settings_cls, init_kwargs=converted)
    return source


class Settings(BaseSettings):
    """Server configuration; NeMo Gym's genrm_compare names where they exist."""

    model_config = SettingsConfigDict(
        env_prefix="GENRM_", env_nested_delimiter="__", extra="forbid", case_sensitive=False
    )

    listen: str = "127.0.0.1:50051"
    #: Share ``listen`` with other processes (SO_REUSEPORT); off: a busy port is an error.
    listen_reuse_port: bool = False
    judge: JudgeSettings = Field(default_factory=JudgeSettings)

    # --- cohorts (NeMo Gym names)
    num_rollouts_per_prompt: Annotated[int, Field(ge=1)] = 8
    comparison_mode: Literal["rollout_cohort", "fixed_baseline"] = "rollout_cohort"
    comparison_strategy: Literal["circular", "all_pairs"] = "circular"
    num_judges_per_comparison: Annotated[int, Field(ge=1)] = 1
    use_principle: bool = True
    default_principle: str = DEFAULT_PRINCIPLE
    aggregator_method: Literal["simple_tiebreaker", "bradley_terry"] = "simple_tiebreaker"
    reasoning_bonus: NonNegative = 0.0
    answer_bonus: NonNegative = 0.0
    top_percentile: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 0.2
    group_reasoning_length_penalty_coeff: NonNegative = 0.0
    group_answer_length_penalty_coeff: NonNegative = 0.0
    group_style_penalty_coeff: NonNegative = 0.0
    default_score: Annotated[float, Field(allow_inf_nan=False)] = 3.0
    default_ranking: Annotated[float, Field(allow_inf_nan=False)] = 3.5
    genrm_parse_retries: Annotated[int, Field(ge=0)] = 3
    genrm_parse_retry_sleep_s: NonNegative = 0.2
    cohort_collection_timeout_s: Seconds = 1800.0
    cohort_evaluation_timeout_s: Seconds = 3600.0
    judge_request_timeout_s: Seconds = 1800.0
    #: 0 = NeMo Gym's behaviour; > 0: connection failures, resets, 502/503/504 and
    #: request timeouts are retried for this long without spending genrm_parse_retries.
    judge_outage_tolerance_s: NonNegative = 0.0
    #: Send a second, identical request when one is unanswered this long (None = off).
    judge_hedge_after_s: Seconds | None = None
    #: ``startup``: one cheap request to the judge at start-up, its result in one line.
    judge_probe: Literal["startup", "off"] = "startup"
    judge_probe_timeout_s: Seconds = 5.0
    #: Judge unreachable for longer than this → CohortService health NOT_SERVING.
    judge_unreachable_window_s: Seconds = 30.0
    cohort_result_ttl_s: Seconds = 3600.0
    max_terminal_cohorts: Annotated[int, Field(ge=1)] = 4096

    # --- this service's own
    position_debias: bool = False
    judge_max_concurrency: Annotated[int, Field(ge=1)] = 64
    judge_schedule: Literal["after_collection", "eager"] = "after_collection"
    max_active_cohorts: Annotated[int, Field(ge=1)] = 10_000
    max_message_bytes: Annotated[int, Field(ge=1024)] = 4 * 1024 * 1024
    shutdown_grace_s: Seconds = 30.0
    #: Where cohort state and the verdict journal are kept: ``sqlite:///PATH`` (a file,
    #: survives restarts) or ``memory://`` (nothing survives the process).
    store: str = "sqlite:///genrm-state.sqlite3"
    #: ``group``: a later attempt of a group reuses journaled verdicts on byte-identical
    #: questions instead of calling the judge again; ``off``: always judge.
    verdict_reuse: Literal["group", "off"] = "group"
    #: Replicas on a shared ``redis://`` store: how long an evaluating replica's lease on
    #: a cohort lasts without renewal (renewed every third of it); after it expires
    #: another replica takes the evaluation over.
    replica_lease_s: Annotated[float, Field(gt=0, le=3600)] = 10.0
    #: Judge calls one cohort may need (pairs of its declared group_size × judges);
    #: a member declaring more is refused with INVALID_ARGUMENT before any work.
    max_judge_passes_per_cohort: Annotated[int, Field(ge=1)] = 16_384
    #: Judge passes of running Compare calls (queued or judging); more → CAPACITY_EXHAUSTED.
    max_queued_compare_passes: Annotated[int, Field(ge=1)] = 4096
    #: Longest a SubmitMember/Compare call without a client deadline waits.
    max_call_wait_s: Seconds = 3600.0
    #: Connection lifetime (gRPC channel args); None = unlimited.
    max_connection_age_s: Seconds | None = None
    max_connection_age_grace_s: Seconds | None = None
    max_connection_idle_s: Seconds | None = None

    # --- operations and security
    #: Prometheus endpoint ``HOST:PORT`` (its own port); None = no metrics endpoint.
    metrics_listen: str | None = None
    tls: TlsSettings | None = None
    auth: AuthSettings | None = None
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    # Every waiting SubmitMember call holds a stream, so a collector with many groups in
    # flight on one connection needs room: 64 groups of 16 already take 1,024.
    max_concurrent_streams: Annotated[int, Field(ge=1)] = 4096
    # Calls that arrived but that the server has not picked up yet: grpc-core refuses
    # calls beyond its pending queue with a bare CANCELLED (1,000 by default, 3,000 hard),
    # which a burst of members sent as unary calls reaches at once.
    max_pending_rpcs: Annotated[int, Field(ge=1)] = 65536
    # CohortService calls in progress (a waiting SubmitMember is one for as long as its
    # group collects and is judged; a StreamGroups stream is one): past it a new call is
    # refused with UNAVAILABLE / SERVER_OVERLOADED, which the client resends.
    max_concurrent_rpcs: Annotated[int, Field(ge=1)] = 65536
    max_group_size: Annotated[int, Field(ge=1, le=MAX_GROUP_SIZE)] = MAX_GROUP_SIZE
    max_prompt_messages: Annotated[int, Field(ge=1)] = 1024
    max_text_chars: Annotated[int, Field(ge=1)] = 1024 * 1024
    max_compare_candidates: Annotated[int, Field(ge=1, le=MAX_GROUP_SIZE)] = 64
    # --- StreamGroups bounds and per-principal quotas (docs/security.md)
    stream_max_buffered_events: Annotated[int, Field(ge=1)] = 1024
    stream_max_held_bytes: Annotated[int, Field(ge=1)] = 256 * 1024 * 1024
    connection_max_held_bytes: Annotated[int, Field(ge=1)] = 1024 * 1024 * 1024
    max_active_cohorts_per_principal: Annotated[int, Field(ge=1)] | None = None
    max_compare_passes_per_principal: Annotated[int, Field(ge=1)] | None = None
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["json", "text"] = "json"

    @field_validator("listen")
    @classmethod
    def _listen_has_port(cls, value: str) -> str:
        return _host_port(value, "listen")

    @field_validator("store")
    @classmethod
    def _store_url(cls, value: str) -> str:
        from genrm_grpc.store.durable import validate_store_url

        if value == "memory":  # the name before the durable stores existed
            return "memory://"
        return validate_store_url(value)

    @field_validator("metrics_listen")
    @classmethod
    def _metrics_listen_has_port(cls, value: str | None) -> str | None:
        return None if value is None else _host_port(value, "metrics_listen")

    @model_validator(mode="after")
    def _one_member_fits_the_stream_bounds(self) -> Settings:
        # A stream that holds nothing must always be able to take one member.
        for name in ("stream_max_held_bytes", "connection_max_held_bytes"):
            if getattr(self, name) < self.max_message_bytes + STREAM_MEMBER_OVERHEAD_BYTES:
                raise ValueError(
                    f"{name} must be at least max_message_bytes + "
                    f"{STREAM_MEMBER_OVERHEAD_BYTES} (one member and its bookkeeping)"
                )
        if self.stream_max_held_bytes > self.connection_max_held_bytes:
            raise ValueError("stream_max_held_bytes must not exceed connection_max_held_bytes")
        return self

    @model_validator(mode="after")
    def _default_group_fits(self) -> Settings:
        if self.num_rollouts_per_prompt > self.max_group_size:
            raise ValueError(
                f"num_rollouts_per_prompt={self.num_rollouts_per_prompt} exceeds "
                f"max_group_size={self.max_group_size}"
            )
        plan = self.pass_plan()
        passes = plan.pass_count(self.num_rollouts_per_prompt)
        if passes > self.max_judge_passes_per_cohort:
            raise ValueError(
                f"num_rollouts_per_prompt={self.num_rollouts_per_prompt} needs {passes} judge "
                f"passes ({plan.describe()}), more than max_judge_passes_per_cohort="
                f"{self.max_judge_passes_per_cohort}"
            )
        return self

    def pass_plan(self) -> PassPlan:
        """The judge passes of a cohort under this configuration (to count and plan them)."""
        return PassPlan.of(
            self.comparison_mode,
            self.comparison_strategy,
            self.num_judges_per_comparison,
            self.position_debias,
        )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_source = _yaml_source(settings_cls)
        if yaml_source is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, yaml_source)


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The settings block behind a field's annotation (``TlsSettings | None`` → TlsSettings)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def config_keys(model: type[BaseModel] = BaseModel, prefix: str = "") -> list[str]:
    """Every configuration key as a dotted path (``listen``, ``judge.url``, …)."""
    model = Settings if model is BaseModel else model
    keys: list[str] = []
    for name, field in model.model_fields.items():
        keys.append(prefix + name)
        block = _nested_model(field.annotation)
        if block is not None:
            keys.extend(config_keys(block, f"{prefix}{name}."))
    return keys


ENV_PREFIX = "GENRM_"


def env_name(key: str) -> str:
    """The environment variable of a dotted key: ``judge.url`` → ``GENRM_JUDGE__URL``."""
    return ENV_PREFIX + key.replace(".", "__").upper()


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def check_environment(settings: Settings, environ: Mapping[str, str] | None = None) -> None:
    """Refuse ``GENRM_*`` variables that configure nothing, like unknown YAML keys.

    pydantic-settings reads the variables it knows and ignores the rest, so a typo such as
    ``GENRM_JUDGE_URL`` (one underscore) would silently leave the default in force.
    Variables that the configuration names as secret holders (``judge.api_key_env``,
    ``auth.tokens_env``) are not settings and pass.
    """
    environ = os.environ if environ is None else environ
    known = [env_name(key) for key in config_keys()]
    named = {settings.judge.api_key_env}
    if settings.auth is not None:
        named.add(settings.auth.tokens_env)
    problems = []
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known or variable in named:
            continue
        close = difflib.get_close_matches(
            upper.removeprefix(ENV_PREFIX), [k.removeprefix(ENV_PREFIX) for k in known], 1, 0.75
        )
        hint = f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""
        if not hint:
            hint = (
                f" (settings are {ENV_PREFIX}<KEY> and {ENV_PREFIX}<BLOCK>__<KEY>; a variable "
                "holding a secret must be named by judge.api_key_env or auth.tokens_env)"
            )
        problems.append(f"unknown environment variable {variable}{hint}")
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))


def _one_line(exc: ValidationError) -> str:
    parts = []
    keys = config_keys()
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "config"
        hint = _did_you_mean(where, keys) if err["type"] == "extra_forbidden" else ""
        parts.append(f"{where}: {err['msg']}{hint}")
    return "invalid configuration: " + "; ".join(parts)


def load_settings(
    config_file: str | os.PathLike[str] | None = None,
    *,
    strict_env: bool = True,
    **overrides: Any,
) -> Settings:
    """Load settings; raises :class:`ConfigError` with a one-line message when invalid.

    ``overrides`` are the flags (the highest precedence; ``None`` means "not given"); a
    nested block such as ``judge={"url": ...}`` overrides only the keys it names.
    With ``strict_env`` an unknown ``GENRM_*`` environment variable is an error.
    """
    token = _yaml_path.set(pathlib.Path(config_file) if config_file is not None else None)
    try:
        clean = {k: v for k, v in overrides.items() if v is not None}
        settings = Settings(**clean)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None
    finally:
        _yaml_path.reset(token)
    if strict_env:
        check_environment(settings)
    return settings
