"""The command line of ``python -m cxlmpi``: one table of its options, the
parser and the usage text both read.

An option either sets a CXLMPI_* setting (a switch to a fixed value, or a
value option to its argument: ``--pool-size 32M``, ``--pool-size=32M``) or
is a command that ends the options (``--info``, ``--pool-status``...).  The
first word that is no option starts the program, as Python's own command
line has it: ``script.py``, ``-m mod``, ``-c cmd`` or ``-`` (standard input),
then its arguments.  A setting's option says nothing of its own: its help is
the setting's summary (cxlmpi.config.VARIABLES), so each is described once.
"""

from __future__ import annotations

import os
import sys
import textwrap
from dataclasses import dataclass

from .. import config

__all__ = ["Option", "OPTIONS", "PROGRAM_FORMS", "usage", "parse"]


@dataclass(frozen=True)
class Option:
    """One option of ``python -m cxlmpi``.  `flags`: its spellings.  Either
    `setting` (the CXLMPI_* variable it sets: to `value` for a switch, to
    its argument, named `metavar`, for a value option) or `command` (what
    main() does; `words`: the words one of which may follow it, passed on).  `help`:
    the usage line; empty for an option that sets a setting to its
    argument or turns it on, whose line is the setting's summary (with the
    variable's name, as an explicit one starts)."""

    flags: tuple[str, ...]
    setting: str = ""
    value: str = ""
    metavar: str = ""
    command: str = ""
    words: tuple[str, ...] = ()
    help: str = ""

    @property
    def synopsis(self) -> str:
        """How the usage text writes it: "--pool SPEC", "--pool-reset [all]",
        "--info [--all/--cache/--markdown]"."""
        spelt = ", ".join(self.flags)
        if self.metavar:
            return f"{spelt} {self.metavar}"
        return f"{spelt} [{'/'.join(self.words)}]" if self.words else spelt

    @property
    def description(self) -> str:
        """Its usage line: `help`, or the summary of the setting it sets,
        naming the variable (plain text)."""
        if self.help:
            return self.help
        var = _VARIABLES[self.setting]
        assignment = f"{var.name}={self.value}" if self.value else var.name
        summary = config.plain(var.summary)
        if summary[1:2].islower():   # (an acronym keeps its capitals)
            summary = summary[0].lower() + summary[1:]
        return f"{assignment}: {summary}"


_VARIABLES = {var.name: var for var in config.VARIABLES}

OPTIONS: tuple[Option, ...] = (
    Option(("--stats",), setting="CXLMPI_STATS", value="1"),
    Option(("--no-pool",), setting="CXLMPI_DISABLE", value="1"),
    Option(("--alloc",), setting="CXLMPI_ALLOC", value="1",
           help="CXLMPI_ALLOC=1: NumPy places large arrays in the pool (the default "
                "where pool memory gets huge pages: --info)"),
    Option(("--no-alloc",), setting="CXLMPI_ALLOC", value="0",
           help="CXLMPI_ALLOC=0: NumPy's own allocator for every array"),
    Option(("--threshold",), setting="CXLMPI_THRESHOLD", metavar="SIZE"),
    Option(("--pool-size",), setting="CXLMPI_POOL_SIZE", metavar="SIZE"),
    Option(("--coherence",), setting="CXLMPI_COHERENCE", metavar="MODE"),
    Option(("--timeout",), setting="CXLMPI_TIMEOUT", metavar="SECONDS"),
    Option(("--pool",), setting="CXLMPI_POOL", metavar="SPEC"),
    Option(("--pool-groups",), setting="CXLMPI_POOL_GROUPS", metavar="G"),
    Option(("--version",), command="version",
           help="print the versions of cxlmpi, the MPI library and mpi4py, one a line, "
                "and exit"),
    Option(("--info",), command="info", words=("--all", "--cache", "--markdown"),
           help="print version, MPI library, the pool and the settings that differ from "
                "their defaults, and exit (--all: every setting and the windows; --cache: "
                "the selection cache's entries for this job; --markdown: the reference's "
                "tables of settings and options)"),
    Option(("--pool-status",), command="status",
           help="print the partition table of a pool file or device"),
    Option(("--pool-reset",), command="reset", words=("all",),
           help="free partitions whose jobs are gone (all: every partition, and write "
                "a new table; only when no job uses the pool)"),
    Option(("-h", "--help"), command="help", help="show this help and exit"),
)

#: The forms of the program to run, as Python's own command line has them.
PROGRAM_FORMS = ("<pyfile>", "-m <mod>", "-c <cmd>", "-")
_NEEDS_ARGUMENT = ("-m", "-c")

_BY_FLAG = {flag: option for option in OPTIONS for flag in option.flags}
_HELP_COLUMN = 23
_WIDTH = 80


def usage() -> str:
    """The usage text: the forms of the command line, then every option."""
    forms = [f"[options] {form} [arg] ..." for form in PROGRAM_FORMS]
    forms += [f"[options] {option.synopsis}" for option in OPTIONS
              if option.command and option.command != "help"]
    lines = [f"{'usage' if i == 0 else '   or'}: python -m cxlmpi {form}"
             for i, form in enumerate(forms)]
    lines += ["", "options:"]
    for option in OPTIONS:
        head = f"  {option.synopsis}"
        text = textwrap.wrap(option.description, _WIDTH - _HELP_COLUMN)
        if len(head) < _HELP_COLUMN - 1:
            lines.append(f"{head:<{_HELP_COLUMN}}{text[0]}")
            text = text[1:]
        else:
            lines.append(head)
        lines += [" " * _HELP_COLUMN + line for line in text]
    return "\n".join(lines) + "\n"


def _usage(message: str | None = None) -> None:
    if message:
        sys.stderr.write(f"python -m cxlmpi: {message}\n")
    sys.stderr.write(usage())
    sys.exit(2 if message else 0)


def _option(arg: str) -> tuple[Option | None, str | None]:
    """The option `arg` spells and the value it carries ("--pool=shm"), if any."""
    if arg in _BY_FLAG:
        return _BY_FLAG[arg], None
    flag, eq, value = arg.partition("=")
    option = _BY_FLAG.get(flag)
    if eq and option is not None and option.metavar:
        return option, value
    return None, None


def parse(argv: list[str]) -> tuple[str, list[str]]:
    """(command, args) from the command line, applying the options that set
    settings to os.environ: a command of OPTIONS ("info", "status",
    "reset", "version"; args: one of its `words` when it follows, else []) or "run" (args: the
    program's command line, ``[pyfile | -m mod | -c cmd | -] [arg] ...``).
    Exits with the usage text on -h or a malformed command line."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        option, value = _option(arg)
        if option is None:
            if arg in _NEEDS_ARGUMENT and i + 1 == len(argv):
                _usage(f"option {arg} needs an argument")
            if arg in _NEEDS_ARGUMENT or arg == "-" or not arg.startswith("-"):
                return "run", argv[i:]
            _usage(f"unknown option {arg}")
        elif option.command == "help":
            _usage()
        elif option.command:
            given = argv[i + 1:i + 2]
            return option.command, given if given and given[0] in option.words else []
        elif option.metavar:
            if value is None:
                i += 1
                if i == len(argv):
                    _usage(f"option {arg} needs a value")
                value = argv[i]
            os.environ[option.setting] = value
        else:
            os.environ[option.setting] = option.value
        i += 1
    _usage("no program given")
    raise AssertionError  # unreachable
