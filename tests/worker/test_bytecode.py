"""A worker names the packages it had to compile from source at start, by whether their bytecode files exist."""

from __future__ import annotations

import importlib
import py_compile
import sys

from worker import bytecode


def _import_fresh(tmp_path, monkeypatch, name: str):
    """``name`` (a package) and its ``name.part`` submodule, imported from source with nothing kept."""
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "part.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # as PYTHONDONTWRITEBYTECODE=1: nothing kept
    for module in (name, f"{name}.part"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    importlib.invalidate_caches()
    return importlib.import_module(name), importlib.import_module(f"{name}.part")


def _compile(module) -> None:
    py_compile.compile(module.__file__, cfile=importlib.util.cache_from_source(module.__file__))


def test_a_package_imported_from_source_without_its_bytecode_is_named(tmp_path, monkeypatch):
    package, part = _import_fresh(tmp_path, monkeypatch, "farmtest_uncached")
    assert "farmtest_uncached" in bytecode.uncached()
    _compile(package)
    assert "farmtest_uncached" in bytecode.uncached()  # its submodule still compiles at every start
    _compile(part)
    assert "farmtest_uncached" not in bytecode.uncached()


def test_the_cache_prefix_is_where_python_looks(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    package, part = _import_fresh(tmp_path / "src", monkeypatch, "farmtest_prefixed")
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "pyc"))
    assert "farmtest_prefixed" in bytecode.uncached()
    for module in (package, part):
        _compile(module)
    assert str(tmp_path / "pyc") in importlib.util.cache_from_source(package.__file__)
    assert "farmtest_prefixed" not in bytecode.uncached()
