"""The reference pages' generated parts, read from the code at build time so
that they cannot drift from it.

Each generator returns Markdown (MyST) text; a directive of the same name
parses it into the page.  The tests (tests/test_docs.py) call the same
generators, so "what the page says" and "what the test checks" are one text.

    ```{cxlmpi-argparse} python -m cxlmpi.bench
    ```                        usage, options and epilog of a command's parser
    ```{cxlmpi-usage}
    ```                        python -m cxlmpi's usage text (from its OPTIONS)
    ```{cxlmpi-pool-table}
    ```                        which methods the shim intercepts, with windows
    ```{cxlmpi-kernels}
    ```                        the reduction ops and element types of the kernels
    ```{cxlmpi-stats-fields}
    ```                        the fields of cxlmpi.stats()

The settings and options tables are committed text in the pages (the output
of ``python -m cxlmpi --info --markdown``, readable without a build); a
build whose committed block differs from what the generator prints fails
with a warning (and so does tests/test_docs.py).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: Every command whose reference comes from an argparse parser: the name a
#: user types, and where its parser is (a module, or a file of the clone).
COMMANDS: dict[str, tuple[str, str]] = {
    "python -m cxlmpi.bench": ("module", "cxlmpi.tools.bench"),
    "python -m cxlmpi.tune": ("module", "cxlmpi.tools.tune"),
    "tools/compare.py": ("file", "tools/compare.py"),
}

#: The pages that hold a block of `python -m cxlmpi --info --markdown`, by block.
GENERATED_BLOCKS = {"settings": "reference/settings", "options": "reference/command-line"}

_MARKED = re.compile(r"^<!-- (\w+): python -m cxlmpi --info --markdown .*?^<!-- end of \1 -->$",
                     re.M | re.S)


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


def parser_of(command: str) -> argparse.ArgumentParser:
    """The argparse parser of `command` (a key of COMMANDS), as its main()
    builds it: main() runs until it parses its arguments, where the parser
    is taken and main() stopped, so a parser built inside main() is found
    as well as one from a build_parser()."""
    kind, where = COMMANDS[command]
    if kind == "module":
        module = importlib.import_module(where)
    else:
        spec = importlib.util.spec_from_file_location("_cxlmpi_docs_" + Path(where).stem,
                                                      ROOT / where)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    saved = (argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args)
    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = capture  # type: ignore[method-assign]
    try:
        module.main([])
    except _Captured as captured:
        return captured.parser
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = saved
    raise RuntimeError(f"{command}: main() returned without parsing its arguments")


def flags_of(parser: argparse.ArgumentParser) -> list[str]:
    """Every option string of the parser (and each positional's name)."""
    out = []
    for action in parser._actions:
        out += list(action.option_strings) or [action.dest]
    return out


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def argparse_markdown(command: str) -> str:
    """A command's reference: its usage, description, one table row per
    option (spellings, default, meaning) and its epilog."""
    parser = parser_of(command)
    parser.prog = command
    usage = parser.format_usage().strip()
    lines = ["```text", usage, "```", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    lines += ["| option | default | meaning |", "|---|---|---|"]
    for action in parser._actions:
        if action.option_strings:
            metavar = action.metavar or (action.dest.upper() if action.nargs != 0 else "")
            spelt = ", ".join(action.option_strings)
            shown = f"{spelt} {metavar}".strip()
        else:
            shown = action.dest
        default = action.default
        if default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
            default = ""
        if action.choices:
            shown += " {" + ",".join(map(str, action.choices)) + "}"
        help_text = (action.help or "") % {"default": default, "prog": command} \
            if action.help and "%(" in action.help else (action.help or "")
        lines.append(f"| `{_cell(shown)}` | {f'`{_cell(default)}`' if default != '' else ''} "
                     f"| {_cell(help_text)} |")
    if parser.epilog:
        lines += ["", "```text", parser.epilog.rstrip(), "```"]
    return "\n".join(lines)


def usage_markdown() -> str:
    """python -m cxlmpi's usage text, as `-h` prints it."""
    from cxlmpi.launch import command_line

    return "```text\n" + command_line.usage().rstrip() + "\n```"


def _methods() -> dict[str, str]:
    """Every collective method of MPI.Intracomm whose name is one of the
    intercepted collectives' or a nonblocking, persistent, neighborhood or
    Alltoallw relative of one, with what a CXLComm does with it: "pool"
    when cxlmpi defines it (the shim's own method), "MPI" when CXLComm
    inherits mpi4py's unchanged."""
    from cxlmpi._pool import COLLECTIVES
    from mpi4py import MPI

    from cxlmpi import CXLComm

    families = set(COLLECTIVES) | {"alltoallw"}
    out = {}
    for name in sorted(dir(MPI.Intracomm)):
        base = name.lower()
        base = base[:-len("_init")] if base.endswith("_init") else base
        if base.startswith("neighbor_"):
            base = "alltoallw"
        elif base not in families and base.startswith("i") and base[1:] in families:
            base = base[1:]
        if base not in families or not name[:1].isupper():
            continue
        own = any(name in vars(cls) for cls in CXLComm.__mro__
                  if cls not in MPI.Intracomm.__mro__)
        out[name] = "pool" if own else "MPI"
    return out


def _window(window: tuple[int, int | None] | None) -> str:
    from cxlmpi.tools.report import format_size

    if window is None:
        return "MPI always"
    low, high = window
    if high is None:
        return "every size" if low == 0 else f"{format_size(low)} and up"
    return f"{format_size(low)} to {format_size(high)}"


def pool_table_markdown() -> str:
    """What goes through the pool, from the data the shim uses: the
    collectives it intercepts (cxlmpi._pool.COLLECTIVES, pyx/cxl_codes.h),
    the windows of the default settings and of CXLMPI_TUNING=builtin
    (cxlmpi.config), and the methods a CXLComm leaves to mpi4py."""
    from cxlmpi._pool import COLLECTIVES

    from cxlmpi import config

    adaptive = config.Config({})
    builtin = config.Config({"CXLMPI_TUNING": "builtin"})
    methods = _methods()
    lines = ["| index | collective | methods | may take the pool (default settings) "
             "| `CXLMPI_TUNING=builtin` | pool spanning hosts |", "|---|---|---|---|---|---|"]
    for index, name in enumerate(COLLECTIVES):
        own = [m for m, where in methods.items() if where == "pool" and m.lower() == name]
        windows = [_window(cfg.windows(hosts=hosts)[name]) if name != "barrier" else "no data"
                   for cfg, hosts in ((adaptive, False), (builtin, False), (adaptive, True))]
        lines.append(f"| {index} | `{name}` | {', '.join(f'`{m}`' for m in own)} | "
                     + " | ".join(windows) + " |")
    passed = [m for m, where in methods.items() if where == "MPI"]
    extra = [m for m, where in methods.items()
             if where == "pool" and m.lower() not in COLLECTIVES]
    lines += ["", "Sizes are bytes of all blocks together. Adaptive selection (the default) "
              "times MPI against the pool inside the window and keeps the faster. "
              "`Barrier` carries no data: it takes the pool once the communicator has a "
              "pool, and only with `CXLMPI_ORDERING=0` (with ordering, MPI's own barrier "
              "already does its work).", ""]
    from cxlmpi._shim import POSTED_TO_POOL, POSTED_UNDER_TUNING_POOL

    posted = [m for m in extra if m in POSTED_TO_POOL]
    tuned = [m for m in extra if m in POSTED_UNDER_TUNING_POOL]
    counted = [m for m in extra if m not in POSTED_TO_POOL + POSTED_UNDER_TUNING_POOL]
    if posted:
        lines += ["Nonblocking and persistent forms that take the pool under their "
                  "blocking form's rules (run by the pool's worker thread; see "
                  "*Nonblocking and persistent collectives*): "
                  + ", ".join(f"`{m}`" for m in posted) + ".", ""]
    if tuned:
        lines += ["The same, but only with `CXLMPI_TUNING=pool` (run by the worker "
                  "they were slower than stock's at some sizes): "
                  + ", ".join(f"`{m}`" for m in tuned) + ".", ""]
    if counted:
        lines += ["Defined by cxlmpi only to count their calls (`cxlmpi.stats()`), they "
                  "go to MPI: " + ", ".join(f"`{m}`" for m in counted) + ".", ""]
    lines += ["Inherited from mpi4py unchanged, so they always go to MPI: "
              + ", ".join(f"`{m}`" for m in passed) + "."]
    return "\n".join(lines)


def kernels_markdown() -> str:
    """The predefined ops and element types the pool's reduction kernels
    implement (cxlmpi._pool.OP_CODES, TYPE_CODES)."""
    from cxlmpi._pool import OP_CODES, TYPE_CODES

    return ("| reduction ops | element types |\n|---|---|\n"
            f"| {', '.join(f'`MPI.{op}`' for op in OP_CODES)} "
            f"| {', '.join(f'`{code}`' for code in TYPE_CODES)} |")


#: The meaning of each field of cxlmpi.stats(); a field the code reports
#: that is missing here fails the build (stats_fields_markdown).
STATS_FIELDS = {
    "pool_calls": "calls that ran through the pool",
    "passthrough_calls": "calls that went to MPI",
    "learning_calls": "calls (either path) that adaptive selection timed to learn "
                      "the faster path: exploring a new size or re-checking a decision",
    "zerocopy_calls": "pool calls that read or wrote the ranks' own pool-resident "
                      "buffers in place",
    "nbytes": "bytes moved through the pool (for object collectives: the frames of "
              "all ranks together)",
    "seconds": "time in pool calls; with `CXLMPI_STATS=1` in passed-through calls too",
}
COHERENCE_FIELDS = {
    "flushed_lines": "cache lines flushed or invalidated for software coherence "
                     "(0 in `hw` mode)",
    "emulated": "under `CXLMPI_COHERENCE=emulate` only: the emulator's `writebacks`, "
                "`invalidates`, `evictions` and `dropped` lines",
}


def stats_fields_markdown() -> str:
    """A table of the fields of one collective's entry of cxlmpi.stats(),
    read from a live stats() (a field it reports without a description
    here raises, which fails the build), then the "coherence" entry."""
    import cxlmpi

    figures = cxlmpi.stats()
    row = next(value for key, value in figures.items() if key != "coherence")
    missing = sorted(set(row) - set(STATS_FIELDS)) + \
        sorted(set(figures["coherence"]) - set(COHERENCE_FIELDS))
    if missing:
        raise ValueError(f"cxlmpi.stats() reports fields the reference does not describe: "
                         f"{missing} (docs/_ext/cxlmpi_reference.py, STATS_FIELDS)")
    lines = ["| field | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {STATS_FIELDS[name]} |" for name in row]
    lines += ["", "The entry `\"coherence\"`:", "", "| field | meaning |", "|---|---|"]
    lines += [f"| `{name}` | {text} |" for name, text in COHERENCE_FIELDS.items()]
    return "\n".join(lines)


def generated_blocks() -> dict[str, str]:
    """The blocks of `python -m cxlmpi --info --markdown`, by name."""
    from cxlmpi.reports import info

    return {m.group(1): m.group(0) for m in _MARKED.finditer(info.markdown())}


def stale_blocks(name: str, text: str) -> list[str]:
    """What is wrong with the generated blocks a page should hold (`name`:
    a key of GENERATED_BLOCKS): missing, repeated, or not as generated."""
    found = [m.group(0) for m in _MARKED.finditer(text) if m.group(1) == name]
    if len(found) != 1:
        return [f"the {name} table appears {len(found)} times (once expected)"]
    if found[0] != generated_blocks()[name]:
        return [f"the {name} table is not what `python -m cxlmpi --info --markdown` "
                f"prints: replace it (markers included) with that output"]
    return []


GENERATORS = {
    "cxlmpi-usage": lambda argument: usage_markdown(),
    "cxlmpi-argparse": argparse_markdown,
    "cxlmpi-pool-table": lambda argument: pool_table_markdown(),
    "cxlmpi-kernels": lambda argument: kernels_markdown(),
    "cxlmpi-stats-fields": lambda argument: stats_fields_markdown(),
}


def setup(app: Any) -> dict[str, Any]:
    from docutils import nodes
    from docutils.statemachine import StringList
    from sphinx.util import logging
    from sphinx.util.docutils import SphinxDirective

    logger = logging.getLogger(__name__)

    def directive(generate: Any) -> type:
        class Generated(SphinxDirective):
            optional_arguments = 1
            final_argument_whitespace = True
            has_content = False

            def run(self) -> list[Any]:
                text = generate(self.arguments[0] if self.arguments else "")
                container = nodes.container()
                self.state.nested_parse(StringList(text.splitlines(), self.get_source_info()[0]),
                                        self.content_offset, container)
                return container.children

        return Generated

    for name, generate in GENERATORS.items():
        app.add_directive(name, directive(generate))

    def check_blocks(app: Any, docname: str, source: list[str]) -> None:
        for name, page in GENERATED_BLOCKS.items():
            if docname == page:
                for problem in stale_blocks(name, source[0]):
                    logger.warning(problem, location=docname)

    app.connect("source-read", check_blocks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
