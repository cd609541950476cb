"""Every number that C and Python share is declared once, in
pyx/cxl_codes.h, and every Python table that names those numbers agrees
with it: the collectives (their names, their order), the variant flags and
path codes, the size classes.  A reorder on one side would mislabel
cxlmpi.stats() or route a call down another path, silently."""

from __future__ import annotations

import re

from harness import ROOT

import cxlmpi
from cxlmpi import _pool, _shim, config, select
from cxlmpi.pools import hierarchy
from cxlmpi.select import cache, classes
from cxlmpi.tools import bench, tune

HEADER = (ROOT / "pyx" / "cxl_codes.h").read_text()


def _enum(first: str) -> list[tuple[str, str]]:
    """(name, value or "") of the entries of the header's enum that opens
    with `first`."""
    body = HEADER[HEADER.index(first):]
    body = body[:body.index("};")]
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    return re.findall(r"\b(CXL_\w+)\s*(?:=\s*([^,}]+))?", body)


def _names(array: str) -> list[str]:
    """The strings of the header's array `array`."""
    body = HEADER[HEADER.index(array):]
    return re.findall(r'"(\w+)"', body[:body.index("};")])


def test_the_collectives_are_the_headers_in_its_order() -> None:
    enum = [name for name, _ in _enum("CXL_BARRIER")]
    assert enum[-1] == "CXL_NCOLL"
    names = _names("cxl_collective_names[]")
    assert [f"CXL_{n.upper()}" for n in names] == enum[:-1]
    assert _pool.COLLECTIVES == _shim.COLLECTIVES == config.COLLECTIVES == tuple(names)
    assert _shim.METHODS == tuple(n.capitalize() for n in names)
    for method in _shim.METHODS:
        assert callable(getattr(_shim.CommBase, method))


def test_cxlmpi_stats_rows_are_the_collectives() -> None:
    assert list(_shim.stats_rows()) == list(config.COLLECTIVES)
    assert set(config.COLLECTIVES) <= set(cxlmpi.stats())


def test_every_python_table_of_collectives_names_known_ones() -> None:
    known = set(config.COLLECTIVES)
    assert set(hierarchy.ACROSS_GROUPS) <= known
    assert set(classes._MOVE) | set(classes._REDUCE) | set(classes._REDUCE_SCATTER) <= known
    assert set(config.Config({}).windows()) == known
    assert set(tune.DERIVED.values()) <= known
    measured = {op.stat_key for op in bench.BENCHMARKS.values()}
    assert measured - known == {"bcast_view"}


def test_variant_flags_and_path_codes_are_the_headers() -> None:
    flags = dict(_enum("CXL_V_STREAM"))
    count = int(flags.pop("CXL_NVARIANTS"))
    names = _names("cxl_variant_names[]")
    assert len(names) == count == len(flags)
    assert _pool.VARIANT_FLAGS == {n: 1 << i for i, n in enumerate(names)}
    assert {f"CXL_V_{n.upper()}": 1 << i for i, n in enumerate(names)} == \
        {k: int(v) for k, v in flags.items()}
    assert (select.STREAM, select.BIGCHUNK, select.RSAG, select.FLAT) == \
        tuple(_pool.VARIANT_FLAGS[n] for n in ("stream", "bigchunk", "rsag", "flat"))
    paths = {name: value.strip() for name, value in _enum("CXL_PATH_NEW")}
    assert (int(paths["CXL_PATH_NEW"]), int(paths["CXL_PATH_SLOW"]),
            int(paths["CXL_PATH_MPI"]), int(paths["CXL_PATH_POOL"])) == \
        (select.NEW, select.SLOW, select.MPI_PATH, _pool.POOL_PATH) == (-2, -1, 0, 1)
    assert _pool.MAX_PATH == _pool.POOL_PATH + sum(_pool.VARIANT_FLAGS.values())
    # every code a name, every name its code
    for code in range(select.MPI_PATH, _pool.MAX_PATH + 1):
        assert select.code_of(select.code_name(code)) == code
    assert select.code_name(_pool.MAX_PATH) == "+".join(["pool", *names])


def test_size_classes_are_the_headers() -> None:
    assert f"#define CXL_NCLASSES {_pool.NCLASSES}" in HEADER
    assert select.NCLASSES == cache.NCLASSES == _pool.NCLASSES == 64
    assert select.size_class is _pool.size_class
    sizes = [0, 1, 2, 3, 4, 1000, 4096, 4097, (1 << 62) + 1, (1 << 63) - 1]
    sizes += [(1 << k) + d for k in range(63) for d in (-1, 0, 1) if (1 << k) + d >= 0]
    for nbytes in sizes:
        assert select.size_class(nbytes) == max(nbytes.bit_length() - 1, 0), nbytes
        assert select.class_floor(select.size_class(nbytes)) <= max(nbytes, 0)
    assert select.size_class(1 << 63) == select.NCLASSES   # past the table
