"""The command line of `python -m cxlmpi` comes from one option table: the
parser accepts what the usage text lists, an option that sets a setting
names a described one, and the program forms are Python's own (`script.py`,
`-m mod`, `-c cmd`, `-`).  Running programs: tests/test_runner.py."""

from __future__ import annotations

import os

import pytest

from cxlmpi import config
from cxlmpi.launch import command_line
from cxlmpi.launch.command_line import OPTIONS, parse

VARIABLES = {var.name: var for var in config.VARIABLES}


@pytest.fixture(autouse=True)
def _own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser writes the settings to os.environ: a copy per test,
    without the suite's own settings."""
    monkeypatch.setattr(os, "environ", {name: value for name, value in os.environ.items()
                                        if not name.startswith("CXLMPI_")})


def test_every_option_is_a_setting_or_a_command() -> None:
    flags = [flag for option in OPTIONS for flag in option.flags]
    assert len(flags) == len(set(flags))
    for option in OPTIONS:
        assert bool(option.setting) != bool(option.command), option
        if option.setting:
            assert option.setting in VARIABLES, option
            assert bool(option.metavar) != bool(option.value), option
            VARIABLES[option.setting].parse(option.value or VARIABLES[option.setting].default)
        assert option.help or option.setting, option


def test_the_usage_text_lists_every_option() -> None:
    text = command_line.usage()
    for option in OPTIONS:
        assert f"\n  {option.synopsis}" in text, option
        assert " ".join(option.description.split()) in " ".join(text.split()), option
    for form in command_line.PROGRAM_FORMS:
        assert f"python -m cxlmpi [options] {form} [arg] ..." in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_a_setting_option_shows_the_settings_own_summary() -> None:
    option = next(o for o in OPTIONS if o.flags == ("--threshold",))
    summary = config.plain(VARIABLES["CXLMPI_THRESHOLD"].summary)
    assert option.description == f"CXLMPI_THRESHOLD: {summary[0].lower()}{summary[1:]}"


@pytest.mark.parametrize("argv, expect", [
    (["app.py", "-x", "--stats"], ("run", ["app.py", "-x", "--stats"])),
    (["-m", "pkg.mod", "a"], ("run", ["-m", "pkg.mod", "a"])),
    (["-c", "print(1)", "--pool", "x"], ("run", ["-c", "print(1)", "--pool", "x"])),
    (["-", "a"], ("run", ["-", "a"])),
    (["--info"], ("info", [])),
    (["--info", "--markdown"], ("info", ["--markdown"])),
    (["--info", "--cache"], ("info", ["--cache"])),
    (["--info", "--all"], ("info", ["--all"])),
    (["--info", "app.py"], ("info", [])),
    (["--version"], ("version", [])),
    (["--version", "app.py"], ("version", [])),
    (["--pool-status", "all"], ("status", [])),
    (["--pool-reset"], ("reset", [])),
    (["--pool-reset", "all"], ("reset", ["all"])),
])
def test_commands_and_program_forms(argv: list[str], expect: tuple[str, list[str]]) -> None:
    """Options end at the first word that is none: the program's own
    arguments are left alone, as Python's command line leaves them."""
    assert parse(argv) == expect
    assert not [name for name in os.environ if name.startswith("CXLMPI_")]


def test_options_set_their_settings() -> None:
    argv = ["--stats", "--no-pool", "--no-alloc", "--alloc", "--threshold", "8K",
            "--pool-size=32M", "--coherence=sw", "--timeout", "5", "--pool", "numa:0",
            "--pool-groups", "2", "app.py"]
    assert parse(argv) == ("run", ["app.py"])
    assert {name: value for name, value in os.environ.items() if name.startswith("CXLMPI_")} == {
        "CXLMPI_STATS": "1", "CXLMPI_DISABLE": "1", "CXLMPI_ALLOC": "1",
        "CXLMPI_THRESHOLD": "8K", "CXLMPI_POOL_SIZE": "32M", "CXLMPI_COHERENCE": "sw",
        "CXLMPI_TIMEOUT": "5", "CXLMPI_POOL": "numa:0", "CXLMPI_POOL_GROUPS": "2"}


@pytest.mark.parametrize("argv, message", [
    (["--bogus", "app.py"], "unknown option --bogus"),
    (["--stats=1", "app.py"], "unknown option --stats=1"),
    (["--info=1"], "unknown option --info=1"),
    (["--threshold"], "option --threshold needs a value"),
    (["-m"], "option -m needs an argument"),
    (["--stats"], "no program given"),
])
def test_malformed_command_lines(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m cxlmpi: {message}\n") and "usage:" in err


def test_help(capsys) -> None:
    for flag in ("-h", "--help"):
        with pytest.raises(SystemExit) as exc:
            parse(["--stats", flag, "app.py"])
        assert exc.value.code == 0
        assert capsys.readouterr().err == command_line.usage()
