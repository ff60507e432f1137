"""The installed ``genrm-grpc`` command explains itself: overview, --help, --version."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
from importlib.metadata import version

import pytest

from genrm_grpc.cli import COMMANDS

pytestmark = pytest.mark.e2e

# The console script that `pip install` created next to this interpreter.
GENRM_GRPC = str(pathlib.Path(sys.executable).parent / "genrm-grpc")
RST = re.compile(r"``|::|:(class|func|meth|data|mod):|^\.\. ", re.MULTILINE)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([GENRM_GRPC, *args], capture_output=True, text=True, timeout=60)


def _lists_every_command_with_a_summary(text: str) -> None:
    for name, command in COMMANDS.items():
        assert re.search(rf"^  {re.escape(name)} +{re.escape(command.summary)}$", text, re.M)


def test_no_command_lists_the_commands_on_stderr_and_exits_2() -> None:
    done = _run()
    assert done.returncode == 2 and done.stdout == ""
    _lists_every_command_with_a_summary(done.stderr)


@pytest.mark.parametrize("flag", ["--help", "-h", "help"])
def test_help_lists_the_commands_on_stdout_and_exits_0(flag: str) -> None:
    done = _run(flag)
    assert done.returncode == 0 and done.stderr == ""
    _lists_every_command_with_a_summary(done.stdout)
    assert set(COMMANDS) >= {"serve", "collect", "health", "fake-judge", "demo"}


def test_an_unknown_command_suggests_the_closest_and_lists_the_commands() -> None:
    done = _run("serv")
    assert done.returncode == 2
    assert done.stderr.startswith("genrm-grpc: unknown command 'serv' (did you mean 'serve'?)")
    _lists_every_command_with_a_summary(done.stderr)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_installed_versions(flag: str) -> None:
    done = _run(flag)
    assert done.returncode == 0
    assert done.stdout == (
        f"genrm-grpc {version('genrm-grpc')} "
        f"(genrm-cohort-client {version('genrm-cohort-client')})\n"
    )


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_help_is_plain_text(name: str) -> None:
    done = _run(name, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: genrm-grpc {name}")
    assert not RST.search(done.stdout), done.stdout
    assert "`" not in done.stdout


def _options_without_help(text: str) -> list[str]:
    """Option lines of an argparse help text with no description after them."""
    lines = text.splitlines()
    bare = []
    for n, line in enumerate(lines):
        if not re.match(r"^  -", line):
            continue
        spec, _, described = line.strip().partition("  ")
        following = lines[n + 1] if n + 1 < len(lines) else ""
        wrapped = re.match(r"^ {6,}\S", following) is not None and not following.strip().startswith(
            "-"
        )
        if not described.strip() and not wrapped:
            bare.append(spec)
    return bare


def test_the_option_check_finds_an_option_without_help() -> None:
    text = (
        "options:\n  -h, --help  show this\n  --bare VALUE\n"
        "  --long-one LONG\n                        wrapped help\n"
    )
    assert _options_without_help(text) == ["--bare VALUE"]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_of_every_command_has_help_text(name: str) -> None:
    done = _run(name, "--help")
    assert _options_without_help(done.stdout) == []


def test_the_readme_lists_every_command() -> None:
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    for name in COMMANDS:
        assert f"| `{name}` |" in readme, name
