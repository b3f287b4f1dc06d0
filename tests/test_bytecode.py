"""Bytecode kept in the cache folder for an install that has none (`search.bytecode`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from search import bytecode


def _package(root: Path, name: str = "sourceonly") -> Path:
    """A package of two modules with no bytecode beside them."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("from . import part\n")
    (folder / "part.py").write_text("VALUE = 7\n")
    return root


def _run(code: str, root: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE")}
    environment.update(PYTHONPATH=os.pathsep.join([str(root), str(Path(__file__).resolve().parents[1])]), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment, capture_output=True,
                          text=True, timeout=120)


# The folder beside the sources cannot be written (a read-only install); as root `os.access` would say it
# can, so the child is told so for the package's own folder only.
_READ_ONLY = """
    import os, sys
    from pathlib import Path
    from search import bytecode
    real = os.access
    os.access = lambda path, mode, **kw: False if "sourceonly" in str(path) else real(path, mode, **kw)
"""


def test_an_install_without_bytecode_gets_it_in_the_cache_for_the_processes_a_run_starts(tmp_path):
    root = _package(tmp_path / "site")
    cache = tmp_path / "cache"
    result = _run(_READ_ONLY + f"""
    kept = bytecode.keep_bytecode(Path({str(cache)!r}), package="sourceonly")
    print("kept", kept)
    import subprocess
    # a process started afterwards (a Ray worker, the fork server) compiles into the same folder
    subprocess.run([sys.executable, "-c", "import sys, sourceonly; print('child', sys.pycache_prefix)"], check=True)
    """, root)
    assert result.returncode == 0, result.stderr
    assert f"kept {cache / 'bytecode'}" in result.stdout
    assert f"child {cache / 'bytecode'}" in result.stdout
    written = sorted(p.name for p in (cache / "bytecode").rglob("*.pyc") if "sourceonly" in str(p))
    assert [n.split(".")[0] for n in written] == ["__init__", "part"]
    assert not list((root / "sourceonly").rglob("*.pyc"))  # nothing beside the sources


def test_an_install_with_bytecode_or_a_writable_one_is_left_alone(tmp_path):
    root = _package(tmp_path / "site")
    compiled = _run("import sourceonly", root)  # bytecode beside the sources now
    assert compiled.returncode == 0, compiled.stderr
    result = _run(_READ_ONLY + f"""
    print("kept", bytecode.keep_bytecode(Path({str(tmp_path / 'cache')!r}), package="sourceonly"), sys.pycache_prefix)
    """, root)
    assert result.returncode == 0, result.stderr
    assert "kept None None" in result.stdout
    writable = _package(tmp_path / "writable")  # no bytecode yet, but Python writes it beside the sources
    result = _run(f"""
    import sys
    from pathlib import Path
    from search import bytecode
    print("kept", bytecode.keep_bytecode(Path({str(tmp_path / 'cache')!r}), package="sourceonly"), sys.pycache_prefix)
    """, writable)
    assert result.returncode == 0, result.stderr
    assert "kept None None" in result.stdout


def test_an_install_where_no_bytecode_is_written_gets_it_in_the_cache_not_beside_its_sources(tmp_path):
    """`PYTHONDONTWRITEBYTECODE` (set in many container images) keeps bytecode out of the source folders; the
    cache folder is not one of them."""
    root = _package(tmp_path / "site")
    cache = tmp_path / "cache"
    result = _run(f"""
    import os, subprocess, sys
    from pathlib import Path
    from search import bytecode
    print("kept", bytecode.keep_bytecode(Path({str(cache)!r}), package="sourceonly"))
    subprocess.run([sys.executable, "-c", "import sourceonly"], check=True)
    """, root, PYTHONDONTWRITEBYTECODE="1")
    assert result.returncode == 0, result.stderr
    assert f"kept {cache / 'bytecode'}" in result.stdout
    assert len([p for p in (cache / "bytecode").rglob("*.pyc") if "sourceonly" in str(p)]) == 2
    assert not list((root / "sourceonly").rglob("*.pyc"))


def test_a_prefix_the_user_chose_is_kept(tmp_path):
    root = _package(tmp_path / "site")
    theirs = tmp_path / "theirs"
    result = _run(_READ_ONLY + f"""
    print("kept", bytecode.keep_bytecode(Path({str(tmp_path / 'cache')!r}), package="sourceonly"))
    print("prefix", os.environ.get("PYTHONPYCACHEPREFIX"))
    """, root, PYTHONPYCACHEPREFIX=str(theirs))
    assert result.returncode == 0, result.stderr
    assert "kept None" in result.stdout
    assert f"prefix {theirs}" in result.stdout
    assert not (tmp_path / "cache").exists()


def test_workers_keep_the_prefix_through_their_scrubbed_environment(monkeypatch):
    from oracle.sandbox import scrubbed_environment

    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "/somewhere/bytecode")
    assert scrubbed_environment()["PYTHONPYCACHEPREFIX"] == "/somewhere/bytecode"


def test_the_command_line_turns_it_on_before_torch_is_imported(tmp_path):
    """`search.cli` calls `keep_bytecode` before any import of torch: a prefix set later would leave the
    command's own import of torch uncached. (Its cache is the test's: where torch has no bytecode, the
    import keeps some, and not in the user's cache.)"""
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", "import search.cli"], capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parents[1], timeout=120,
                            env={**os.environ, "KERNELSEARCH_CACHE": str(tmp_path / "cache")})
    lines = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()]
    assert "search.bytecode" in lines and "torch" in lines
    assert lines.index("search.bytecode") < lines.index("torch")
