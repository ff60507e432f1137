"""One settings model for the server: YAML file, then env ``GENRM_*``, then flags.

Precedence (highest first): command-line flags, environment variables, the YAML file,
built-in defaults. Environment names are ``GENRM_<KEY>`` for top-level keys and
``GENRM_<BLOCK>__<KEY>`` for a block (e.g. ``GENRM_JUDGE__URL``). Unknown keys are
errors in every source (YAML keys, ``GENRM_*`` variables), so a typo never silently
falls back to a default. The ``judge:``, ``tls:``, ``auth:`` and ``tracing:`` blocks are
declared in ``genrm_grpc/config_blocks.py`` and re-exported here.
"""

from __future__ import annotations

import contextvars
import difflib
import os
import pathlib
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
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
from genrm_grpc.config_blocks import (
    PRINCIPAL_NAME,
    AuthSettings,
    ConfigError,
    JudgeSettings,
    NonNegative,
    Seconds,
    TlsSettings,
    TracingSettings,
    host_port,
    token_principal,
)
from genrm_grpc.runtime.plan import PassPlan

__all__ = [
    "DEFAULT_PRINCIPLE",
    "ENV_PREFIX",
    "PRINCIPAL_NAME",
    "STREAM_MEMBER_OVERHEAD_BYTES",
    "AuthSettings",
    "ConfigError",
    "JudgeSettings",
    "Settings",
    "TlsSettings",
    "TracingSettings",
    "check_environment",
    "config_keys",
    "env_name",
    "load_settings",
    "token_principal",
]

#: What a member held by a StreamGroups stream costs beyond its wire bytes (cohort entry,
#: waiter, digests): charged against the stream's and the connection's byte bounds.
STREAM_MEMBER_OVERHEAD_BYTES = 1024

DEFAULT_PRINCIPLE = (
    "The response should be helpful, relevant, accurate and complete, follow the user's "
    "instructions, and be clearly written."
)


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
        return host_port(value, "listen")

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
        return None if value is None else host_port(value, "metrics_listen")

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
