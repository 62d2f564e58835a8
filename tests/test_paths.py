"""The file layer (encoderx/files.py): a `file://` URL and the plain local path give the
same run (work directory, data files by glob, vocabulary, --init_from, export, plot);
writes are atomic; a gs:// path takes the remote branch (no lock), with no network."""
import logging
import os

import jax
import numpy as np
import pytest
from etils import epath

from encoderx import errors
from encoderx import files, sources, train
from encoderx import workdir as workdir_lib
from encoderx.data import resources
from encoderx.export import writer
from encoderx.tools.figures import plot

ONE_DEVICE = jax.devices()[:1]


def _url(path) -> str:
  return "file://" + str(path)


def test_file_urls_name_local_paths(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  assert files.path("file:///x/y") == epath.Path("/x/y")
  assert files.path("file://localhost/x/y") == epath.Path("/x/y")
  assert files.path("file:///a%20b") == epath.Path("/a b")
  assert files.path("rel/x") == epath.Path(tmp_path / "rel" / "x")
  assert files.path("~/x") == epath.Path(os.path.expanduser("~/x"))
  assert str(files.path("gs://bucket/run")) == "gs://bucket/run"
  assert str(files.path("gs://bucket/run") / "checkpoints") == "gs://bucket/run/checkpoints"
  assert files.is_remote("gs://bucket/run") and files.is_remote(epath.Path("gs://b/x"))
  assert not any(map(files.is_remote, ["file:///x", "/x", "x", tmp_path]))
  assert resources.resolve("file:///x/vocab.txt") == "/x/vocab.txt"
  assert files.optional("") is None and files.optional("file:///d") == "/d"


def test_globs_match_the_same_files_by_url_and_path(tmp_path):
  for name in ("a/1.txt", "a/2.txt", "b/3.txt", "b/skip.md"):
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_text("text\n")
  expected = [str(tmp_path / n) for n in ("a/1.txt", "a/2.txt", "b/3.txt")]
  for pattern in ("*/*.txt", "[ab]/?.txt"):
    assert files.glob(str(tmp_path / pattern)) == expected
    assert files.glob(_url(tmp_path / pattern)) == expected
  assert files.glob(_url(tmp_path / "a/1.txt")) == expected[:1]
  assert files.glob(str(tmp_path / "c/*.txt")) == []
  both = f"{_url(tmp_path / 'a/*.txt')}, {tmp_path / 'b/*.txt'}"
  assert files.resolve_patterns(both) == expected
  with pytest.raises(errors.ConfigError, match="'file://.*/c/\\*' matches no file"):
    files.resolve_patterns(_url(tmp_path / "c/*"))


def test_write_atomically_never_leaves_a_partial_file(tmp_path, monkeypatch):
  target = tmp_path / "new" / "config.json"
  files.write_atomically(_url(target), "old")
  assert target.read_text() == "old" and oct(target.stat().st_mode)[-3:] == "644"

  def crash(*_):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(os, "replace", crash)  # dies after writing, before the rename
  with pytest.raises(OSError, match="No space left"):
    files.write_atomically(target, b"new" * 1000)
  assert target.read_text() == "old" and os.listdir(target.parent) == ["config.json"]


def test_remote_paths_take_the_remote_branch_without_network(tmp_path, monkeypatch, caplog):
  # A gs:// work directory is not locked (no flock on an object store): nothing is
  # written or contacted.
  lock = workdir_lib.Lock("gs://bucket/run")
  with caplog.at_level(logging.WARNING, logger="encoderx"), lock:
    assert lock.remote and lock._fd is None  # pylint: disable=protected-access
  assert "gs://bucket/run is remote and cannot be locked" in caplog.text
  # The remote branches themselves, run on a local directory taken for a remote one.
  monkeypatch.setattr(files, "is_remote", lambda p: True)
  run = tmp_path / "run"
  assert workdir_lib.prepare(str(run)) == str(run) and os.listdir(run) == []  # probed
  files.write_atomically(run / "config.json", "{}")  # an object store's write: direct
  assert os.listdir(run) == ["config.json"]
  (run / "sub").mkdir()
  (run / "sub" / "x.bin").write_bytes(b"\0\1")
  copy = files.local_copy(str(run))
  assert copy != str(run) and files.local_copy(str(run)) == copy  # copied once
  assert sorted(os.listdir(copy)) == ["config.json", "sub"]
  assert (epath.Path(copy) / "sub" / "x.bin").read_bytes() == b"\0\1"


def test_preprocessed_examples_in_a_bucket_are_a_clear_error(tiny_config):
  # ArrayRecord opens local files only: a URL would otherwise be written under a local
  # "gs:" directory (--output) or fail inside its C++ reader.
  from encoderx import preprocess  # pylint: disable=g-import-not-at-top
  from encoderx.data import example_files  # pylint: disable=g-import-not-at-top
  with pytest.raises(errors.ConfigError, match="flag --output: 'gs://b/x' is a URL"):
    preprocess.run(tiny_config(), "gs://b/x")
  with pytest.raises(errors.ConfigError,
                     match="'data.preprocessed': 'gs://b/x' is a URL"):
    example_files.read_manifest("gs://b/x")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The same tiny pretraining run twice: every path plain, then every path a file://
  URL (work directory, corpus glob, vocabulary); returns {kind: (workdir, result)}."""
  from conftest import _tiny_config  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("paths")
  corpus = resources.resolve("bundled:austen")
  vocab = resources.resolve("bundled:austen-wordpiece")
  made = {}
  for kind, as_given in (("path", str), ("url", _url)):
    config = _tiny_config()
    config.train.steps = 3
    config.checkpoint.every_steps = 3
    config.data.files = as_given(corpus)
    config.data.vocab.path = as_given(vocab)
    workdir = root / kind
    result = train.run(config, as_given(workdir), show_progress=False, devices=ONE_DEVICE)
    made[kind] = (workdir, result)
  return made


@pytest.mark.slow
def test_a_run_in_file_urls_is_the_run_in_paths(runs):
  (by_path, plain), (by_url, url) = runs["path"], runs["url"]
  assert [h["loss"] for h in url["history"]] == [h["loss"] for h in plain["history"]]
  assert url["eval"] == pytest.approx(plain["eval"])
  for workdir in (by_path, by_url):
    assert (workdir / "config.json").is_file() and (workdir / "checkpoints" / "3").is_dir()
    assert not (workdir / workdir_lib.LOCK_NAME).exists()  # released
  curves = plot.curves(_url(by_url), "mlm_loss")
  np.testing.assert_array_equal(curves["train"][1], plot.curves(str(by_url), "mlm_loss")
                                ["train"][1])


@pytest.mark.slow
def test_init_from_and_export_take_file_urls(runs, tmp_path):
  workdir = runs["path"][0]
  by_url, by_path = (sources.open_source(_url(workdir)),
                     sources.open_source(str(workdir)))
  assert by_url.name == by_path.name == str(workdir) and by_url.vocab == by_path.vocab
  jax.tree_util.tree_map(np.testing.assert_array_equal, by_url.load_params(),
                         by_path.load_params())
  step = sources.open_source(_url(workdir / "checkpoints" / "3"))
  assert step.name == str(workdir)
  with pytest.raises(sources.InitError, match=f"'{tmp_path}/none' does not exist"):
    sources.open_source(_url(tmp_path / "none"))
  exported = writer.export_npz(_url(workdir), _url(tmp_path / "url.npz"))
  writer.export_npz(str(workdir), str(tmp_path / "path.npz"))
  assert exported.output == str(tmp_path / "url.npz")
  with np.load(tmp_path / "url.npz") as url, np.load(tmp_path / "path.npz") as path:
    assert url.files == path.files
    for name in url.files:
      np.testing.assert_array_equal(url[name], path[name])
  pytest.importorskip("transformers")
  exported = writer.export_hf(_url(workdir), _url(tmp_path / "hf"))
  assert exported.output == str(tmp_path / "hf") and "vocab.txt" in exported.files
  source = sources.open_source(f"hf:{_url(tmp_path / 'hf')}")
  assert source.vocab["path"] == str(tmp_path / "hf" / "vocab.txt")
