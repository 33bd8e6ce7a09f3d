"""The on-disk cache: a second process recompiles nothing; a corrupt entry is rewritten."""

import logging
import os

import torch
from helpers import Block, run_in_new_process

import kiln

TRAIN_STEP = """
import json, sys, torch, kiln, kiln_cpp
sys.path.insert(0, {helpers!r})
from helpers import Block, run_in_new_process
torch.manual_seed(0)
model = Block()
compiled = kiln.compile(model, options={{"cache_dir": {cache!r}}})
x = torch.randn(4, 16)
out = compiled(x)
out.pow(2).sum().backward()
grad = model.up.weight.grad.clone()
model.zero_grad()
model(x).pow(2).sum().backward()
torch.testing.assert_close(grad, model.up.weight.grad)
print(json.dumps({{"stages": sorted(kiln.compile_times()), "builds": kiln_cpp.cpp_codegen.builds}}))
"""


def run_train_step(tmp_path) -> dict:
    script = TRAIN_STEP.format(
        helpers=os.path.dirname(__file__), cache=str(tmp_path / "kiln-cache")
    )
    return run_in_new_process(script, tmp_path)


def test_a_second_process_recompiles_nothing(tmp_path):
    first = run_train_step(tmp_path)
    assert {"loopir", "render", "build"} <= set(first["stages"])
    assert first["builds"] == 2  # the forward and the backward graph
    second = run_train_step(tmp_path)
    assert "loopir" not in second["stages"] and "render" not in second["stages"]
    assert "cache_load" in second["stages"]
    # what the second process logged (a cached native host program it could not load
    # builds the kernels alone, a library of another key) says why, where it does not
    assert second["builds"] == 0, f"the kernels come from kiln-cpp's cache:\n{second['stderr']}"


def entries(root):
    return sorted((root / "graphs").rglob("*.pt"))


def compile_and_check(options):
    torch.manual_seed(0)
    model = Block().eval()  # in training mode, its backward would be compiled (and kept) too
    x = torch.randn(4, 16)
    torch.testing.assert_close(kiln.compile(model, options=options)(x), model(x))


def test_a_corrupt_entry_is_ignored_and_rewritten(tmp_path, caplog):
    options = {"cache_dir": str(tmp_path)}
    compile_and_check(options)
    (entry,) = entries(tmp_path)
    good = entry.read_bytes()
    entry.write_bytes(good[: len(good) // 2])  # truncated
    kiln.reset()
    with caplog.at_level(logging.WARNING, logger="kiln.cache"):
        compile_and_check(options)
    assert any("ignoring corrupt cache entry" in r.getMessage() for r in caplog.records)
    assert "loopir" in kiln.compile_times(), "the graph was compiled again"
    assert entry.read_bytes() != good[: len(good) // 2], "the entry was rewritten"
    kiln.reset()
    compile_and_check(options)
    assert "loopir" not in kiln.compile_times(), "the rewritten entry loads"


def test_the_key_follows_inputs_and_options(tmp_path):
    options = {"cache_dir": str(tmp_path)}
    compile_and_check(options)
    compile_and_check({**options, "fusion": False})
    assert len(entries(tmp_path)) == 2
    f = kiln.compile(lambda x: x.exp().sum(0), options=options)
    f(torch.randn(3, 5))
    f(torch.randn(4, 5, dtype=torch.float64))
    assert len(entries(tmp_path)) == 4


def test_an_entry_for_the_python_host_program_is_not_loaded_for_the_native_one(tmp_path):
    options = {"cache_dir": str(tmp_path)}
    compile_and_check({**options, "host_program": "python"})
    kiln.reset()
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(4, 16)
    compiled = kiln.compile(model, options={**options, "host_program": "native"})
    torch.testing.assert_close(compiled(x), model(x))  # "native" raises without one
    assert "loopir" in kiln.compile_times(), "compiled again, with its native host program"
    assert len(entries(tmp_path)) == 2


def test_an_entry_made_by_other_sources_of_kiln_is_not_loaded(tmp_path, monkeypatch):
    """A working tree installed editable keeps its version while its code changes."""
    options = {"cache_dir": str(tmp_path)}
    compile_and_check(options)
    kiln.reset()
    edited = {"kiln_loopir": "0123456789abcdef"}
    digest = kiln.cache._source_digest
    monkeypatch.setattr(kiln.cache, "_source_digest", lambda p: edited.get(p) or digest(p))
    kiln.cache.versions.cache_clear()
    try:
        compile_and_check(options)
    finally:
        kiln.cache.versions.cache_clear()
    assert "loopir" in kiln.compile_times(), "compiled again"
    assert len(entries(tmp_path)) == 2


def test_the_source_digest_follows_a_file_of_the_package(tmp_path, monkeypatch):
    package = tmp_path / "edited_package"
    package.mkdir()
    (package / "__init__.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = kiln.cache._source_digest("edited_package")
    (package / "__init__.py").write_text("X = 2\n")
    kiln.cache._source_digest.cache_clear()
    assert kiln.cache._source_digest("edited_package") != before


def test_cache_off_writes_nothing(tmp_path):
    compile_and_check({"cache_dir": str(tmp_path), "cache": False})
    assert not (tmp_path / "graphs").exists()


def test_graphs_with_zero_dim_constants_are_cached(tmp_path):
    def f(x):
        return torch.nn.functional.layer_norm(x, (4,)) * torch.tensor(3.0)

    x = torch.randn(2, 4)
    torch.testing.assert_close(kiln.compile(f, options={"cache_dir": str(tmp_path)})(x), f(x))
    assert len(entries(tmp_path)) == 1


def _small_entry(text: str):
    from kiln.cache import Entry

    return Entry([], [], text, {}, 0, "", "")


def test_the_least_recently_used_entries_are_evicted(tmp_path, monkeypatch):
    from kiln.cache import GraphCache

    monkeypatch.setenv("KILN_CACHE_MAX_MB", "0")  # no bound while they are written
    cache = GraphCache(tmp_path)
    keys = [f"{i:02x}" * 32 for i in range(4)]
    for i, key in enumerate(keys):
        cache.store(key, _small_entry(f"program {i}"))
        os.utime(cache.path(key), (1000 + i, 1000 + i))  # stored in this order, long ago
    assert cache.load(keys[0]) is not None  # used again: now the most recent
    size = cache.path(keys[0]).stat().st_size
    monkeypatch.setenv("KILN_CACHE_MAX_MB", str(2.5 * size / 2**20))
    cache.store("ff" * 32, _small_entry("program 4"))  # five entries, room for two
    assert sorted(p.stem for p in entries(tmp_path)) == sorted([keys[0], "ff" * 32])


def test_the_size_bound_reads_its_variable(monkeypatch):
    from kiln.cache import DEFAULT_MAX_MB, max_bytes

    monkeypatch.delenv("KILN_CACHE_MAX_MB", raising=False)
    assert max_bytes() == DEFAULT_MAX_MB * 2**20
    monkeypatch.setenv("KILN_CACHE_MAX_MB", "0")
    assert max_bytes() is None
    monkeypatch.setenv("KILN_CACHE_MAX_MB", "1.5")
    assert max_bytes() == int(1.5 * 2**20)
