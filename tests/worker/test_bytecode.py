"""A worker names the packages it had to compile from source at start, by whether their bytecode file exists."""

from __future__ import annotations

import importlib
import py_compile
import sys

from worker import bytecode


def _import_fresh(tmp_path, monkeypatch, name: str):
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # as PYTHONDONTWRITEBYTECODE=1: nothing kept
    monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.invalidate_caches()
    return importlib.import_module(name)


def test_a_package_imported_from_source_without_its_bytecode_is_named(tmp_path, monkeypatch):
    module = _import_fresh(tmp_path, monkeypatch, "farmtest_uncached")
    assert bytecode.uncached(("farmtest_uncached", "not_imported_here")) == ["farmtest_uncached"]
    py_compile.compile(module.__file__, cfile=importlib.util.cache_from_source(module.__file__))
    assert bytecode.uncached(("farmtest_uncached",)) == []


def test_the_cache_prefix_is_where_python_looks(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    module = _import_fresh(tmp_path / "src", monkeypatch, "farmtest_prefixed")
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "pyc"))
    assert bytecode.uncached(("farmtest_prefixed",)) == ["farmtest_prefixed"]
    py_compile.compile(module.__file__, cfile=importlib.util.cache_from_source(module.__file__))
    assert str(tmp_path / "pyc") in importlib.util.cache_from_source(module.__file__)
    assert bytecode.uncached(("farmtest_prefixed",)) == []
