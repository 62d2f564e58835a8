"""Data at corpus scale: preprocessed shards and their manifest, streams of text files and
preprocessed examples, per-process shards, and resuming a stream in constant time."""
import collections
import json
import os

import jax
import numpy as np
import pytest
import seqio

from encoderx import config as config_lib, errors
from encoderx.methods import registry as method_registry
from encoderx import preprocess, train
from encoderx.data import example_files, pipeline, shard_stream, tasks

ONE_DEVICE = jax.devices()[:1]
FILES, DOCUMENTS, SENTENCES = 3, 15, 8


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory, austen_lines):
  """FILES text files of DOCUMENTS documents of SENTENCES Austen lines each (BERT's
  format: a sentence per line, a blank line between documents)."""
  directory = tmp_path_factory.mktemp("corpus")
  lines = iter(austen_lines(FILES * DOCUMENTS * SENTENCES))
  for index in range(FILES):
    documents = ["\n".join(next(lines) for _ in range(SENTENCES)) for _ in range(DOCUMENTS)]
    (directory / f"part{index}.txt").write_text("\n\n".join(documents) + "\n")
  return directory


def _config(tiny_config, corpus_dir, **data):
  config = tiny_config()
  config.data.files = str(corpus_dir / "*.txt")
  config.data.document_marker = ""
  config.data.sentence_per_line = True
  config.data.eval_every_nth_document = 5
  config.data.shuffle_buffer = 32
  for field, value in data.items():
    config.data[field] = value
  return config


@pytest.fixture(scope="session")
def written(tmp_path_factory, corpus_dir):
  """(config, directory): the small corpus preprocessed with 2 copies by 2 workers."""
  from conftest import _tiny_config  # pylint: disable=import-outside-toplevel
  config = _config(lambda: _tiny_config(), corpus_dir)
  output = tmp_path_factory.mktemp("preprocessed") / "examples"
  preprocess.run(config, str(output), copies=2, workers=2, show_progress=False)
  return config, str(output)


def _preprocessed_config(written_fixture):
  config, directory = written_fixture
  config = preprocess.source_config(config)
  config.data.streaming, config.data.preprocessed = False, directory
  return config


def _ids(examples) -> list[bytes]:
  return [e["input_ids"].tobytes() for e in examples]


def test_manifest_counts_every_file_and_a_run_checks_it(written):
  config, directory = written
  manifest = example_files.read_manifest(directory)
  length = manifest["lengths"]["64"]
  assert list(length["features"]) == ["input_ids", "token_type_ids", "segment_ids",
                                      "positions", "word_starts", "sentence_label"]
  train_split = length["splits"]["train"]
  assert len(train_split["copies"]) == 2 and len(length["splits"]["validation"]["copies"]) == 1
  for copy in train_split["copies"]:
    assert [e["source"] for e in copy] == tasks.corpus_files(config.data)
    for entry in copy:
      assert example_files.count_records(os.path.join(directory, entry["file"])) == (
          entry["examples"]) > 0
  assert train_split["examples"] == sum(e["examples"] for c in train_split["copies"] for e in c)
  assert manifest["examples"]["vocabulary_sha256"] == example_files.vocabulary_fingerprint(
      config.data.vocab)["vocabulary_sha256"]
  assert not os.path.exists(os.path.join(directory, preprocess.PLAN))

  other = _preprocessed_config(written)
  other.data.builder, other.objective.names = "full_sentences", ("mlm",)
  other.data.vocab.lower_case = False
  other.train.long_fraction, other.train.long_seq_length = 0.5, 128
  with pytest.raises(example_files.ManifestError) as error:
    tasks.preprocessed_source(other)
  message = str(error.value)
  for difference in ("builder: preprocessed 'sentence_pairs', this config 'full_sentences'",
                     "sentence_objective: preprocessed 'nsp', this config None",
                     "vocabulary_lower_case: preprocessed True, this config False",
                     "lengths: preprocessed [64], this config trains at [64, 128]"):
    assert difference in message
  with pytest.raises(example_files.ManifestError, match="holds no manifest.json"):
    example_files.read_manifest(os.path.dirname(directory))


def test_preprocessing_never_overwrites_and_continues_where_it_stopped(written, tmp_path):
  config, directory = written
  with pytest.raises(Exception, match="already holds preprocessed examples"):
    preprocess.run(config, directory, copies=2, workers=1, show_progress=False)
  # An interrupted run: the plan and some finished files, no manifest.
  output = tmp_path / "again"
  output.mkdir()
  units = preprocess.plan(config, copies=2)
  for unit in units[:-1]:
    os.link(os.path.join(directory, unit.file), output / unit.file)
  (output / preprocess.PLAN).write_text(json.dumps(
      {**preprocess.writer._description(config, 2), "lengths": [64]}))  # pylint: disable=protected-access
  with pytest.raises(Exception, match="unfinished preprocessing of another config"):
    preprocess.run(config, str(output), copies=1, workers=1, show_progress=False)
  manifest = preprocess.run(config, str(output), copies=2, workers=1, show_progress=False)
  assert manifest == example_files.read_manifest(directory)
  for unit in units:
    assert _ids(example_files.read_records(str(output / unit.file), manifest["lengths"]["64"][
        "features"])) == _ids(example_files.read_records(
            os.path.join(directory, unit.file), manifest["lengths"]["64"]["features"]))


def test_preprocessed_examples_are_those_of_streaming_the_text(written):
  config, _ = written
  text = tasks.register_pretraining_task(preprocess.source_config(config))
  examples = tasks.register_pretraining_task(_preprocessed_config(written))
  assert pipeline.is_streamed(text) and pipeline.is_streamed(examples)
  raw = pipeline.stream_shards(text, "train", 64, config.train.seed)
  ready = pipeline.stream_shards(examples, "train", 64, config.train.seed)
  # Copy c is what epoch c of the text stream builds; epoch 2 reads copy 0 again.
  assert _ids(ready[1].open(1, 0)) == _ids(raw[1].open(1, 0))
  assert _ids(ready[1].open(2, 0)) == _ids(ready[1].open(0, 0)) != _ids(ready[1].open(1, 0))
  # Whole streams in their first epoch (a run's first phase is seeded with train.seed):
  # shard order, interleaving, window shuffle and batches agree; so do evaluations.
  seed = config.train.seed
  assert [_ids([b]) for b in pipeline.take_batches(text, "train", 64, 8, 6, seed)] == [
      _ids([b]) for b in pipeline.take_batches(examples, "train", 64, 8, 6, seed)]
  assert [_ids([b]) for b in pipeline.evaluation_batches(text, "validation", 64, 8, 2, seed)
          ] == [_ids([b]) for b in pipeline.evaluation_batches(examples, "validation", 64, 8,
                                                               2, seed)]
  # seqio users read the first copy through the Task.
  dataset = examples.get_dataset({"input_ids": 64}, "train", shuffle=False)
  assert _ids(dataset.take(20).as_numpy_iterator()) == _ids(ready[0].open(0, 0))[:20]


def test_text_streams_hold_out_documents_by_their_place_in_their_file(tiny_config,
                                                                      corpus_dir):
  config = _config(tiny_config, corpus_dir, streaming=True)
  source = tasks.register_pretraining_task(config).source
  held_out = {split: [int(d["document_id"]) for d in source.get_dataset(
      split, shuffle=False, shard_info=None).as_numpy_iterator()] for split in tasks.SPLITS}
  assert held_out["validation"] == [4, 9, 14] * FILES
  assert len(held_out["train"]) == (DOCUMENTS - 3) * FILES


def test_text_shards_open_without_tracing_the_task_again(tiny_config, corpus_dir):
  # Every shard, epoch and seed reuses one traced pipeline, and gets what seqio's
  # get_dataset builds for that shard alone, bit for bit.
  task = tasks.register_pretraining_task(_config(tiny_config, corpus_dir, streaming=True))
  shards = pipeline.stream_shards(task, "train", 64, seed=3)
  for index, epoch in ((0, 0), (2, 1)):
    seed = pipeline.epoch_seed(3, epoch, index)
    whole = pipeline.build_dataset(task, "train", 64, False, seed,
                                   seqio.ShardInfo(index=index, num_shards=FILES))
    want = list(whole.as_numpy_iterator())
    got = list(shards[index].open(epoch, 0))
    assert len(got) == len(want) > 0
    for example, expected in zip(got, want):
      assert example.keys() == expected.keys()
      for name in expected:
        np.testing.assert_array_equal(example[name], expected[name])
    assert _ids(shards[index].open(epoch, 5)) == _ids(want[5:])
  assert pipeline._tokenized_shard(task, "train").experimental_get_tracing_count() == 1


def _unshuffled_epoch(shards, count):
  iterator = shard_stream.ShardStream(shards, seed=0, shuffle=False).__iter__()
  return [next(iterator) for _ in range(count)]


def test_an_epoch_is_every_example_once_and_processes_read_their_own_shards(written):
  task = tasks.register_pretraining_task(_preprocessed_config(written))
  shards = pipeline.stream_shards(task, "train", 64, 0)
  manifest = task.source.manifest["lengths"]["64"]["splits"]["train"]
  counts = [[e["examples"] for e in copy] for copy in manifest["copies"]]
  every = [[_ids(shard.open(epoch, 0)) for shard in shards] for epoch in (0, 1)]
  epochs = _ids(_unshuffled_epoch(shards, sum(map(sum, counts))))
  first = sum(counts[0])
  for examples, copy in ((epochs[:first], every[0]), (epochs[first:], every[1])):
    assert collections.Counter(examples) == collections.Counter(sum(copy, []))
  # Two processes: shards 0, 2 and shard 1, in canonical order; together everything once.
  parts = [_ids(shard_stream.all_examples(shards, index, 2)) for index in (0, 1)]
  assert parts == [every[0][0] + every[0][2], every[0][1]]
  with pytest.raises(shard_stream.StreamError,
                     match="3 shard.*fewer than the 5 processes.*data.process_split=rows"):
    next(shard_stream.StreamBatchIterator(shards, 8, 0, window=4, process_count=5))
  # Shuffled epochs read shards in new orders.
  orders = {tuple(shard_stream.shard_order(16, seed=3, epoch=e, shuffle=True)) for e in range(5)}
  assert len(orders) == 5


def _resumed_equals_straight(task, batches_before, batches_after, batch_size=8):
  straight = pipeline.batch_iterator(task, "train", 64, batch_size, seed=7)
  for _ in range(batches_before):
    next(straight)
  position = json.loads(json.dumps({"phase": 0, **straight.position.to_dict()}))
  expected = [next(straight) for _ in range(batches_after)]
  straight.close()
  resumed = pipeline.batch_iterator(task, "train", 64, batch_size, seed=7, position=position)
  try:
    for want in expected:
      got = next(resumed)
      for name in want:
        np.testing.assert_array_equal(got[name], want[name])
  finally:
    resumed.close()
  return position


def test_streams_resume_with_the_next_batch(written, tiny_config, corpus_dir):
  examples = tasks.register_pretraining_task(_preprocessed_config(written))
  epoch = examples.source.manifest["lengths"]["64"]["splits"]["train"]["examples"] // 2
  # Past two epochs (two copies), in the middle of a window and of open shards.
  position = _resumed_equals_straight(examples, 2 * epoch // 8 + 5, 4)
  assert position["stream"]["parent_window_start_state"]["epoch"] >= 2
  text = tasks.register_pretraining_task(_config(tiny_config, corpus_dir, streaming=True))
  _resumed_equals_straight(text, 7, 3)


def _records_decoded_to_resume(task, batches_before, monkeypatch, batch=8) -> int:
  """The records a preprocessed stream decodes to resume `batches_before` batches in and
  give the next batch."""
  straight = pipeline.batch_iterator(task, "train", 64, batch, seed=7)
  for _ in range(batches_before):
    next(straight)
  straight.close()
  decoded, real_decode = collections.Counter(), example_files.decode

  def counting_decode(record, features):
    decoded["records"] += 1
    return real_decode(record, features)

  monkeypatch.setattr(example_files, "decode", counting_decode)
  try:
    resumed = pipeline.batch_iterator(task, "train", 64, batch, seed=7,
                                      position=straight.position.to_dict())
    next(resumed)
    resumed.close()
  finally:
    monkeypatch.setattr(example_files, "decode", real_decode)
  return decoded["records"]


def test_resuming_a_preprocessed_stream_reads_one_window_wherever_it_is(written,
                                                                      monkeypatch):
  task = tasks.register_pretraining_task(_preprocessed_config(written))
  # What resuming reads: the current window (and the next, when the batches prefetched
  # after the position cross into it), wherever the position is.
  bound = 2 * task.shuffle_buffer_size + (shard_stream.PREFETCH_BATCHES + 2) * 8
  early, late = (_records_decoded_to_resume(task, n, monkeypatch) for n in (3, 300))
  assert early <= bound and late <= bound, (early, late, bound)


def _stopped_and_resumed(config, tmp_path, stop_at_step: int) -> tuple[dict, dict]:
  """(straight, resumed): the results of a run and of the same run stopped at
  `stop_at_step` and resumed, whose losses it checks are equal step for step."""
  kwargs = dict(show_progress=False, devices=ONE_DEVICE)
  straight = train.run(config, str(tmp_path / "straight"), **kwargs)
  first = train.run(config, str(tmp_path / "resumed"), stop_at_step=stop_at_step, **kwargs)
  saved = tmp_path / "resumed" / "checkpoints" / str(stop_at_step) / "data_per_process"
  assert "stream" in json.loads((saved / "process_0-of-1.json").read_text())
  second = train.run(config, str(tmp_path / "resumed"), resume=True, **kwargs)
  assert first["stopped"] and second["step"] == config.train.steps
  losses = {h["step"]: h["loss"] for h in first["history"] + second["history"]}
  np.testing.assert_array_equal([losses[s] for s in range(1, config.train.steps + 1)],
                                [h["loss"] for h in straight["history"]])
  return straight, second


def test_a_run_on_preprocessed_examples_stops_and_resumes_exactly(written, tmp_path):
  config = _preprocessed_config(written)
  config.train.steps = 6
  config.checkpoint.every_steps = 100
  config.eval.batches = 0  # the whole held-out split
  straight, second = _stopped_and_resumed(config, tmp_path, stop_at_step=3)
  assert second["eval"] == pytest.approx(straight["eval"]) and "mlm_accuracy" in second["eval"]


# --- XLNet's row streams -------------------------------------------------------------------
ROWS = 8  # xlnet_tiny's rows per process in these tests (train.batch_size, one process)


@pytest.fixture(scope="session")
def xlnet_written(tmp_path_factory, corpus_dir):
  """(config, directory): the small corpus preprocessed as xlnet_tiny's row streams, in
  document sets of 6 documents (two per file: memory restarts inside files too)."""
  from conftest import _tiny_config  # pylint: disable=import-outside-toplevel
  config = _config(lambda: _tiny_config("xlnet:tiny"), corpus_dir, document_pool=6)
  output = tmp_path_factory.mktemp("xlnet") / "streams"
  preprocess.run(config, str(output), workers=1, show_progress=False)
  return config, str(output)


def _stacked(batches, name="input_ids") -> np.ndarray:
  return np.concatenate([batch[name] for batch in batches])


def test_xlnet_streams_are_read_in_order_and_equal_streaming_the_text(xlnet_written):
  config, directory = xlnet_written
  manifest = example_files.read_manifest(directory)
  assert manifest["processes"] == 1 and {
      k: manifest["examples"][k] for k in ("builder", "rows_per_process", "reuse_len",
                                           "bi_data")} == {
      "builder": "xlnet_streams", "rows_per_process": ROWS, "reuse_len": 32, "bi_data": True}
  assert manifest["lengths"]["64"]["features"]["stream_start"] == {"shape": [],
                                                                   "dtype": "int32"}
  text = tasks.register_pretraining_task(preprocess.source_config(config))
  examples = tasks.register_pretraining_task(_preprocessed_config(xlnet_written))
  assert isinstance(text, pipeline.OrderedTask) and isinstance(examples, pipeline.OrderedTask)
  counts = [e["examples"] for e in
            manifest["lengths"]["64"]["splits"]["train"]["copies"][0]]
  assert all(count > 0 and count % ROWS == 0 for count in counts), counts
  # Epoch 0 (copy 0) batch for batch, read from the files and built from the text.
  seed, steps = config.train.seed, sum(counts) // ROWS
  read = pipeline.take_batches(examples, "train", 64, ROWS, steps, seed)
  built = pipeline.take_batches(text, "train", 64, ROWS, steps, seed)
  for got, want in zip(read, built):
    assert got.keys() == want.keys()
    for name in want:
      np.testing.assert_array_equal(got[name], want[name])
  # In order: the shards one after another in the epoch's shard order (not the canonical
  # one), each batch ROWS consecutive examples of one shard: no interleaving, no window.
  shards = pipeline.stream_shards(examples, "train", 64, seed)
  order = shard_stream.shard_order(len(shards), seed, 0, shuffle=True)
  assert list(order) != sorted(order)
  in_order = [example for index in order for example in shards[index].open(0, 0)]
  for name in ("input_ids", "stream_start", "reversed"):
    np.testing.assert_array_equal(_stacked(read, name), [e[name] for e in in_order])
  # A file starts a document set (memory restarts), and so does each set inside a file;
  # rows start together.
  starts = _stacked(read, "stream_start").reshape(steps, ROWS)
  assert (starts.min(axis=1) == starts.max(axis=1)).all()
  first_steps = np.cumsum([0] + [counts[i] // ROWS for i in order[:-1]])
  assert starts[first_steps].all() and starts[:, 0].sum() > len(shards)
  np.testing.assert_array_equal(read[1]["reversed"], [0] * (ROWS // 2) + [1] * (ROWS // 2))
  # Evaluations read the held-out streams alike.
  for got, want in zip(pipeline.evaluation_batches(examples, "validation", 64, ROWS, 2, seed),
                       pipeline.evaluation_batches(text, "validation", 64, ROWS, 2, seed)):
    np.testing.assert_array_equal(got["input_ids"], want["input_ids"])


def test_xlnet_streams_refuse_a_run_with_other_rows_reuse_len_or_bi_data(xlnet_written,
                                                                        tiny_config,
                                                                        corpus_dir,
                                                                        tmp_path):
  config, directory = xlnet_written
  other = _preprocessed_config(xlnet_written)
  other.train.batch_size, other.objective.plm.reuse_len = 16, 16
  other.objective.plm.bi_data = False
  with pytest.raises(example_files.ManifestError, match="holds examples made for another "
                     "config") as error:
    tasks.register_pretraining_task(other)
  for difference in ("rows_per_process: preprocessed 8, this config 16",
                     "reuse_len: preprocessed 32, this config 16",
                     "bi_data: preprocessed True, this config False"):
    assert difference in str(error.value)
  # The examples depend on the rows each process reads: batch 16 on two processes reads
  # these files (each process its own), batch 16 on one does not.
  twice = _preprocessed_config(xlnet_written)
  twice.train.batch_size = 16
  assert tasks.preprocessed_source(twice, process_count=2).manifest["processes"] == 1
  with pytest.raises(example_files.ManifestError, match="rows_per_process: preprocessed 8, "
                     "this config 16"):
    tasks.preprocessed_source(twice, process_count=1)
  # Sentence pairs are not row streams, nor the other way round.
  pairs = preprocess.source_config(_config(tiny_config, corpus_dir))
  pairs.data.streaming, pairs.data.preprocessed = False, directory
  with pytest.raises(example_files.ManifestError, match="builder: preprocessed "
                     "'xlnet_streams', this config 'sentence_pairs'"):
    tasks.preprocessed_source(pairs)
  # --processes: only row streams depend on it, and it must split the batch evenly.
  with pytest.raises(errors.ConfigError, match="^2 processes, but only XLNet's") as refused:
    preprocess.run(_config(tiny_config, corpus_dir), str(tmp_path / "a"), processes=2)
  assert refused.value.argument == "processes"  # the command line's --processes
  with pytest.raises(errors.ConfigError, match="^8 processes do not split "
                     "train.batch_size=8 into an even number"):
    preprocess.run(config, str(tmp_path / "b"), processes=8)
  assert not os.listdir(tmp_path)


def test_xlnet_streams_resume_with_the_next_batch_at_a_seek(xlnet_written, tiny_config,
                                                          corpus_dir, monkeypatch):
  examples = tasks.register_pretraining_task(_preprocessed_config(xlnet_written))
  epoch = examples.source.manifest["lengths"]["64"]["splits"]["train"]["examples"] // ROWS
  # Inside a shard, and past an epoch where the next shard begins a new stream.
  _resumed_equals_straight(examples, 5, 4, batch_size=ROWS)
  position = _resumed_equals_straight(examples, epoch + 7, 3, batch_size=ROWS)
  assert position["stream"]["epoch"] == 1 and len(position["stream"]["open"]) == 1
  text = tasks.register_pretraining_task(
      _config(lambda: tiny_config("xlnet:tiny"), corpus_dir, document_pool=6,
              streaming=True))
  _resumed_equals_straight(text, 9, 3, batch_size=ROWS)
  # Resuming decodes the batches it gives and prefetches, wherever the position is.
  bound = (shard_stream.PREFETCH_BATCHES + 2) * ROWS
  early, late = (_records_decoded_to_resume(examples, n, monkeypatch) for n in (3, 300))
  assert early <= bound and late <= bound, (early, late, bound)


@pytest.mark.slow
def test_a_tiny_xlnet_trains_on_preprocessed_streams_and_resumes_exactly(xlnet_written,
                                                                         tmp_path):
  config = _preprocessed_config(xlnet_written)
  config.train.steps = 20
  config.optimizer.learning_rate, config.optimizer.warmup_steps = 3e-3, 3
  config.checkpoint.every_steps = 100  # only the stop and the end save
  config.eval.batches = 1
  straight, resumed = _stopped_and_resumed(config, tmp_path, stop_at_step=9)
  np.testing.assert_array_equal(np.asarray(resumed["method_state"]["hidden"]),
                                np.asarray(straight["method_state"]["hidden"]))
  assert resumed["eval"] == pytest.approx(straight["eval"]) and "plm_loss" in resumed["eval"]
  history = straight["history"]
  first, last = history[0]["plm_loss"], np.mean([h["plm_loss"] for h in history[-5:]])
  assert last < first - 0.5, (first, last)


def test_electra_checks_a_preprocessed_manifest_instead_of_reading_the_text(written,
                                                                            tiny_config):
  config = tiny_config("electra:tiny")
  config.data.preprocessed = written[1]  # sentence pairs, which electra does not train on
  method = method_registry.build(config_lib.validate(config))
  with pytest.raises(example_files.ManifestError, match="builder: preprocessed "
                     "'sentence_pairs', this config 'doc_sentences'"):
    method.check_data()
