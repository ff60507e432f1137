"""NeMo Gym → genrm-grpc configuration: ``genrm-grpc config from-gym GYM_YAML``.

A Gym file wraps the genrm_compare settings in server blocks::

    genrm_compare_resources_server:          # server instance name
      resources_servers:                     # server type
        genrm_compare:                       # implementation
          genrm_model_server: {type: responses_api_models, name: genrm_model}
          genrm_responses_create_params: {max_output_tokens: 16384, temperature: 0.6, ...}
          num_rollouts_per_prompt: 16
          ...
    genrm_model:                             # the judge's model server block
      responses_api_models:
        genrm_model: {model: ..., base_url: ...}

:func:`convert` finds the genrm_compare block and returns the equivalent genrm-grpc
settings plus notes on everything it dropped or could not carry over:

* scoring and lifecycle keys keep their names and values;
* ``genrm_responses_create_params`` → ``judge.max_output_tokens`` / ``temperature`` /
  ``top_p``;
* the model server named by ``genrm_model_server`` → ``judge.url`` (its ``base_url``)
  and ``judge.model``; when the file has no such block or no ``base_url`` (Gym starts
  vLLM itself), ``judge.url`` is a placeholder on the reserved ``.invalid`` domain;
* Gym's server wrapper and metadata keys (``entrypoint``, ``domain``, ``description``,
  ``datasets``, …) are dropped;
* where genrm-grpc's defaults differ from Gym's (``num_rollouts_per_prompt``,
  ``use_principle``, ``cohort_evaluation_timeout_s``), Gym's value is written
  explicitly so that the migration does not change behaviour.

``serve --config`` runs the same conversion when it is handed a Gym file.
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from genrm_grpc.config import ConfigError

__all__ = [
    "GYM_DEFAULTS",
    "PLACEHOLDER_MODEL",
    "PLACEHOLDER_URL",
    "GymConfigError",
    "GymConversion",
    "convert",
    "for_serve",
    "is_gym_config",
    "main",
    "render",
]

PLACEHOLDER_URL = "http://genrm-judge.placeholder.invalid:8000"
PLACEHOLDER_MODEL = "genrm-judge-placeholder"

# Keys that mean the same in both projects and are copied as they are.
SHARED_KEYS = (
    "num_rollouts_per_prompt",
    "comparison_mode",
    "comparison_strategy",
    "num_judges_per_comparison",
    "use_principle",
    "default_principle",
    "aggregator_method",
    "reasoning_bonus",
    "answer_bonus",
    "top_percentile",
    "group_reasoning_length_penalty_coeff",
    "group_answer_length_penalty_coeff",
    "group_style_penalty_coeff",
    "default_score",
    "default_ranking",
    "genrm_parse_retries",
    "genrm_parse_retry_sleep_s",
    "cohort_collection_timeout_s",
    "cohort_evaluation_timeout_s",
    "judge_request_timeout_s",
    "cohort_result_ttl_s",
    "max_terminal_cohorts",
)

#: Gym's genrm_compare defaults where they differ from genrm-grpc's.
GYM_DEFAULTS: dict[str, Any] = {
    "num_rollouts_per_prompt": 1,
    "use_principle": False,
    "cohort_evaluation_timeout_s": 1800.0,
}

# Gym's server wrapper and metadata keys: meaningful to Gym's launcher only.
GYM_METADATA_KEYS = frozenset(
    {
        "entrypoint",
        "name",
        "host",
        "port",
        "num_workers",
        "domain",
        "verified",
        "verified_url",
        "description",
        "value",
        "license",
        "datasets",
        "debug_logging",
    }
)

CREATE_PARAMS_TO_JUDGE = ("max_output_tokens", "temperature", "top_p")

_INTERPOLATION = re.compile(r"^\$\{([^}]*)\}$")


class GymConfigError(ConfigError):
    """The file is a Gym config that cannot be converted; the message is one line."""


@dataclass
class GymConversion:
    """The genrm-grpc settings equivalent to a Gym genrm_compare block."""

    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    #: Dotted keys whose value is a placeholder the operator must replace.
    placeholders: list[str] = field(default_factory=list)
    block: str = ""


def is_gym_config(data: Any) -> bool:
    """True for a Gym file: server blocks, or a bare genrm_compare block."""
    if not isinstance(data, dict):
        return False
    if "genrm_model_server" in data or "genrm_responses_create_params" in data:
        return True
    return any(isinstance(v, dict) and "resources_servers" in v for v in data.values())


def _genrm_blocks(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for instance, wrapper in data.items():
        if not isinstance(wrapper, dict) or not isinstance(wrapper.get("resources_servers"), dict):
            continue
        for impl, block in wrapper["resources_servers"].items():
            if isinstance(block, dict) and (
                impl == "genrm_compare" or "genrm_model_server" in block
            ):
                found.append((f"{instance}.resources_servers.{impl}", block))
    return found


def _resolve(value: Any, data: dict[str, Any]) -> tuple[Any, str | None]:
    """Resolve ``${name}`` from a top-level scalar and ``${oc.env:VAR}``; else say why not."""
    if not isinstance(value, str):
        return value, None
    match = _INTERPOLATION.match(value.strip())
    if match is None:
        return value, None
    expr = match.group(1).strip()
    if expr.startswith("oc.env:"):
        return None, f"environment variable {expr[len('oc.env:') :].split(',')[0].strip()}"
    target = data.get(expr)
    if isinstance(target, str | int | float) and not isinstance(target, bool):
        return target, None
    return None, f"Gym variable {expr!r}, not set in this file"


def _gym_default_principle() -> str | None:
    """Gym's built-in default principle, read from an installed nemo-gym (else None)."""
    try:
        module = importlib.import_module("resources_servers.genrm_compare.app")
        default = module.GenRMCompareConfig.model_fields["default_principle"].default
    except Exception:
        return None
    return default if isinstance(default, str) and default.strip() else None


def convert(data: Any, *, block_name: str | None = None) -> GymConversion:
    """Convert a parsed Gym YAML document; raises :class:`GymConfigError`."""
    if not is_gym_config(data):
        raise GymConfigError("not a NeMo Gym config: no resources_servers block found")
    assert isinstance(data, dict)
    wrapped, name, block = _pick_block(data, block_name)
    out = GymConversion(settings={}, block=name)
    others = [
        k
        for k, v in data.items()
        if isinstance(v, dict) and k not in (name.split(".")[0], server_name_of(block))
    ]
    if wrapped and others:
        out.notes.append("other Gym blocks ignored: " + ", ".join(others))
    judge = _convert_judge(data, block, out)
    settings = _convert_scoring(block, out)
    out.settings = {"judge": judge, **settings}
    return out


def _pick_block(data: dict[str, Any], block_name: str | None) -> tuple[bool, str, dict[str, Any]]:
    """Whether the file wraps its blocks, and the genrm_compare block's name and body."""
    wrapped = any(isinstance(v, dict) and "resources_servers" in v for v in data.values())
    if not wrapped:
        name, block = "(top level)", data
    else:
        blocks = _genrm_blocks(data)
        if block_name is not None:
            blocks = [(n, b) for n, b in blocks if n.split(".")[0] == block_name]
        if not blocks:
            which = f" named {block_name!r}" if block_name else ""
            raise GymConfigError(
                f"no genrm_compare resources server block{which} in the Gym config"
            )
        if len(blocks) > 1:
            names = ", ".join(n.split(".")[0] for n, _ in blocks)
            raise GymConfigError(
                f"several genrm_compare blocks ({names}): choose one with --block NAME"
            )
        name, block = blocks[0]
    return wrapped, name, block


def _convert_judge(
    data: dict[str, Any], block: dict[str, Any], out: GymConversion
) -> dict[str, Any]:
    """The ``judge:`` block: from the model server block, then the create params."""
    judge: dict[str, Any] = {}
    server_name = server_name_of(block)
    model_block = _model_block(data, server_name) if server_name else None
    if model_block is not None:
        _judge_from_model_block(model_block, server_name or "", data, judge, out)
    elif server_name:
        out.notes.append(
            f"model server {server_name!r} (genrm_model_server) is not defined in this file"
        )
    else:
        out.notes.append("no genrm_model_server in the Gym block")
    params = block.get("genrm_responses_create_params") or {}
    if not isinstance(params, dict):
        raise GymConfigError("genrm_responses_create_params must be a mapping")
    for key, value in params.items():
        if key in CREATE_PARAMS_TO_JUDGE:
            if value is not None:
                judge[key] = value
        elif key == "model" and "model" not in judge and isinstance(value, str):
            judge["model"] = value
        elif key == "input" and not value:
            continue
        else:
            out.notes.append(f"genrm_responses_create_params.{key} has no equivalent; dropped")
    if "url" not in judge:
        judge["url"] = PLACEHOLDER_URL
        out.placeholders.append("judge.url")
    if "model" not in judge:
        judge["model"] = PLACEHOLDER_MODEL
        out.placeholders.append("judge.model")
    # Gym's GenRM model server turns its /v1/responses call into a chat completion with
    # the principle/response_1/response_2 roles: that is what vLLM serving the GenRM does.
    judge["api"] = "chat_completions"
    order = ("url", "api", "model", *CREATE_PARAMS_TO_JUDGE, "api_key_env")
    judge = {key: judge[key] for key in order if key in judge}

    return judge


def _convert_scoring(block: dict[str, Any], out: GymConversion) -> dict[str, Any]:
    """The scoring and lifecycle keys (Gym's defaults where they differ from ours)."""
    settings: dict[str, Any] = {}
    dropped_metadata = []
    for key, value in block.items():
        if key in ("genrm_model_server", "genrm_responses_create_params"):
            continue
        if key in SHARED_KEYS:
            if key == "cohort_result_ttl_s" and value is None:
                out.notes.append(
                    "cohort_result_ttl_s: null (keep forever) is not supported; "
                    "genrm-grpc's default applies"
                )
                continue
            settings[key] = value
        elif key == "cohort_timeout_s":
            settings.setdefault("cohort_collection_timeout_s", value)
            settings.setdefault("cohort_evaluation_timeout_s", value)
            out.notes.append(
                "cohort_timeout_s (one deadline from first member to publication) became "
                "cohort_collection_timeout_s and cohort_evaluation_timeout_s"
            )
        elif key == "score_source" and value not in (None, "overall"):
            raise GymConfigError(f"score_source={value!r} is not supported by genrm-grpc")
        elif key in GYM_METADATA_KEYS or key == "score_source":
            dropped_metadata.append(key)
        else:
            out.notes.append(f"{key} has no genrm-grpc equivalent; dropped")
    if dropped_metadata:
        out.notes.append(
            "Gym metadata dropped (used by Gym's launcher only): " + ", ".join(dropped_metadata)
        )
    for key, value in GYM_DEFAULTS.items():
        if key not in settings:
            settings[key] = value
            out.notes.append(f"{key}: {value!r} (Gym's default, which differs from genrm-grpc's)")
    if settings.get("use_principle") and "default_principle" not in settings:
        principle = _gym_default_principle()
        if principle is None:
            raise GymConfigError(
                "use_principle is true but default_principle is not set, and Gym's built-in "
                "default principle is not available here: set default_principle in the Gym file"
            )
        settings["default_principle"] = principle
        out.notes.append("default_principle: Gym's built-in default, read from nemo-gym")
    return settings


def server_name_of(block: dict[str, Any]) -> str | None:
    """The model server named by ``genrm_model_server`` (None when there is none)."""
    ref = block.get("genrm_model_server")
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else None


def _model_block(data: dict[str, Any], server_name: str) -> dict[str, Any] | None:
    wrapper = data.get(server_name)
    if not isinstance(wrapper, dict):
        return None
    models = wrapper.get("responses_api_models")
    if not isinstance(models, dict):
        return None
    for block in models.values():
        if isinstance(block, dict):
            return block
    return None


def _judge_from_model_block(
    block: dict[str, Any],
    server_name: str,
    data: dict[str, Any],
    judge: dict[str, Any],
    out: GymConversion,
) -> None:
    model, why = _resolve(block.get("model"), data)
    if isinstance(model, str) and model:
        judge["model"] = model
    elif why:
        out.notes.append(f"{server_name}.model comes from the {why}: set judge.model")
    base_url = block.get("base_url")
    if isinstance(base_url, list):
        if len(base_url) > 1:
            out.notes.append(f"{server_name}.base_url lists several URLs; the first is used")
        base_url = base_url[0] if base_url else None
    url, why = _resolve(base_url, data)
    if isinstance(url, str) and url:
        judge["url"] = url
    elif why:
        out.notes.append(f"{server_name}.base_url comes from the {why}: set judge.url")
    else:
        out.notes.append(
            f"{server_name} has no base_url (Gym starts that vLLM itself): serve the judge "
            "yourself and set judge.url"
        )
    api_key = block.get("api_key")
    if api_key is not None:
        match = _INTERPOLATION.match(str(api_key).strip())
        if match and match.group(1).strip().startswith("oc.env:"):
            judge["api_key_env"] = match.group(1).strip()[len("oc.env:") :].split(",")[0].strip()
        else:
            out.notes.append(
                f"{server_name}.api_key is not copied (keys never live in genrm-grpc config): "
                "put it in an environment variable and name it in judge.api_key_env"
            )
    # vLLM launch settings and Gym model-server options have no meaning here.
    extra = sorted(k for k in block if k not in ("model", "base_url", "api_key", "entrypoint"))
    if extra:
        out.notes.append(f"{server_name} settings dropped: {', '.join(extra)}")


def render(conversion: GymConversion, source: str) -> str:
    """The converted settings as commented YAML that ``genrm-grpc serve`` accepts."""
    lines = [
        f"# genrm-grpc configuration converted from the NeMo Gym config {source}",
        f"# (block {conversion.block}) by `genrm-grpc config from-gym`.",
    ]
    for placeholder in conversion.placeholders:
        env = "GENRM_" + placeholder.upper().replace(".", "__")
        lines.append(f"# PLACEHOLDER: {placeholder} — replace it here or set {env}.")
    lines.extend(f"# note: {note}" for note in conversion.notes)
    body = yaml.safe_dump(conversion.settings, sort_keys=False, allow_unicode=True, width=100)
    marked = []
    for line in body.splitlines():
        if line.strip() in (f"url: {PLACEHOLDER_URL}", f"model: {PLACEHOLDER_MODEL}"):
            line += "  # PLACEHOLDER"
        marked.append(line)
    return "\n".join([*lines, *marked]) + "\n"


def for_serve(data: dict[str, Any], path: pathlib.Path) -> dict[str, Any]:
    """``serve --config GYM_YAML``: the converted settings; notes and placeholders on stderr."""
    conversion = convert(data)
    for placeholder in conversion.placeholders:
        env = "GENRM_" + placeholder.upper().replace(".", "__")
        print(
            f"genrm-grpc: {path} is a NeMo Gym config: {placeholder} is a placeholder "
            f"unless a flag or {env} sets it",
            file=sys.stderr,
        )
    for note in conversion.notes:
        print(f"genrm-grpc: {path} is a NeMo Gym config: {note}", file=sys.stderr)
    return conversion.settings


def load_gym_file(path: pathlib.Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise GymConfigError(f"cannot read {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise GymConfigError(f"{path} is not valid YAML: {exc}".replace("\n", " ")) from None


def main(argv: list[str] | None = None) -> int:
    """``genrm-grpc config from-gym GYM_YAML [--block NAME] [--output FILE]``."""
    parser = argparse.ArgumentParser(
        prog="genrm-grpc config",
        description="Configuration tools. from-gym: print the genrm-grpc YAML equivalent to "
        "a NeMo Gym genrm_compare config.",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    from_gym = sub.add_parser("from-gym", help="convert a NeMo Gym genrm_compare config")
    from_gym.add_argument("gym_yaml", type=pathlib.Path)
    from_gym.add_argument("--block", help="the server instance to convert when there are several")
    from_gym.add_argument("--output", "-o", type=pathlib.Path, help="write here (default stdout)")
    args = parser.parse_args(argv)

    from genrm_grpc.config import Settings

    try:
        conversion = convert(load_gym_file(args.gym_yaml), block_name=args.block)
        Settings.model_validate(conversion.settings)  # serve must accept what we print
    except GymConfigError as exc:
        print(f"genrm-grpc config: {exc}", file=sys.stderr)
        return 2
    except (ConfigError, ValueError) as exc:
        message = " ".join(str(exc).split())
        print(f"genrm-grpc config: the converted settings are invalid: {message}", file=sys.stderr)
        return 2
    text = render(conversion, str(args.gym_yaml))
    if args.output is not None:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0
