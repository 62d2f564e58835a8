"""Packed rows (RoBERTa's FULL-SENTENCES / DOC-SENTENCES): structure, no loss, isolation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoderx.data import packing, pipeline, segment_pairs, tasks
from encoderx.models import pretraining

from reference_models import small_model  # pylint: disable=g-bad-import-order

SPECIAL = segment_pairs.SpecialIds(pad=0, cls=2, sep=3)


def _documents(sentence_lengths_per_document):
  """Documents whose token ids encode (document, sentence, index): 10000*d + 100*s + i."""
  documents = []
  for d, lengths in enumerate(sentence_lengths_per_document, start=1):
    sentences = [10000 * d + 100 * s + np.arange(n, dtype=np.int32) for s, n in
                 enumerate(lengths)]
    documents.append(segment_pairs.Document(d, sentences, [np.ones(n, np.int32)
                                                           for n in lengths]))
  return documents


def _sequences(row):
  """[(segment id, token ids between its [CLS] and [SEP])] of a packed row."""
  out = []
  for segment in range(1, int(row["segment_ids"].max()) + 1):
    where = np.flatnonzero(row["segment_ids"] == segment)
    ids = row["input_ids"][where]
    assert ids[0] == SPECIAL.cls and ids[-1] == SPECIAL.sep
    assert (row["positions"][where] == np.arange(len(where))).all()
    out.append((segment, ids[1:-1]))
  return out


@pytest.mark.parametrize("cross_documents", [True, False])
def test_rows_hold_whole_sentences_in_order_and_lose_nothing(cross_documents):
  rng = np.random.default_rng(0)
  documents = _documents([rng.integers(3, 30, rng.integers(1, 12)).tolist()
                          for _ in range(25)])
  packer = packing.SentencePacker(64, SPECIAL, cross_documents=cross_documents)
  rows = list(packer(documents, rng))
  seen = []
  for row in rows:
    real = row["segment_ids"] > 0
    assert real[:real.sum()].all(), "padding only at the end"
    assert (row["input_ids"][~real] == SPECIAL.pad).all()
    assert (row["token_type_ids"] == 0).all()
    sequences = _sequences(row)
    if not cross_documents:
      assert len(sequences) == 1
    for _, ids in sequences:
      assert len(set(ids // 10000)) == 1, "a sequence is one document's"
      starts = np.flatnonzero(ids % 100 == 0)
      assert len(starts) and starts[0] == 0, "a sequence starts with a whole sentence"
      seen.extend(ids.tolist())
  expected = [t for d in documents for s in d.sentences for t in s.tolist()]
  assert seen == expected, "every token once, in document order"
  fill = [int((r["segment_ids"] > 0).sum()) for r in rows]
  if cross_documents:  # a row ends only when the next sentence does not fit
    assert min(fill[:-1]) > 64 - 30 - 2


def test_overlong_sentences_are_split_not_dropped():
  documents = _documents([[150, 5]])
  rows = list(packing.SentencePacker(32, SPECIAL, cross_documents=True)(documents, None))
  tokens = [t for r in rows for _, ids in _sequences(r) for t in ids.tolist()]
  assert tokens == [t for s in documents[0].sentences for t in s.tolist()]
  assert all((r["segment_ids"] > 0).sum() <= 32 for r in rows)


# DeBERTa: relative distances (restarting in each sequence, as positions do) and absolute
# positions only in the enhanced mask decoder.
DEBERTA = dict(attention=dict(variant="disentangled", position_buckets=8,
                              max_relative_positions=16),
               embeddings=dict(position="none"), heads=dict(enhanced_mask_decoder=True))


@pytest.mark.parametrize("family", [{}, DEBERTA], ids=["bert", "deberta"])
def test_packed_rows_compute_what_their_documents_compute_alone(family):
  config = small_model(vocab_size=120, hidden_size=32, num_layers=2, intermediate_size=64,
                       embeddings=dict(size=32, max_positions=64)).replace(**family)
  model = pretraining.PretrainingModel(config, heads=("mlm",))
  rng = np.random.default_rng(1)
  lengths = [7, 12, 5, 19]  # four sequences packed into one row of 48
  packed = {name: np.zeros([1, 48], np.int32) for name in segment_pairs.TOKEN_FEATURES}
  alone = {name: np.zeros([4, 48], np.int32) for name in segment_pairs.TOKEN_FEATURES}
  start = 0
  for index, length in enumerate(lengths):
    ids = rng.integers(5, 120, length)
    for batch, row, offset in ((packed, 0, start), (alone, index, 0)):
      batch["input_ids"][row, offset:offset + length] = ids
      batch["segment_ids"][row, offset:offset + length] = index + 1 if batch is packed else 1
      batch["positions"][row, offset:offset + length] = np.arange(length)
    start += length
  # Jitted: eagerly, JAX compiles each of the model's operations on its own (slow).
  params = jax.jit(model.init)(jax.random.key(0), pretraining.init_batch(1, 8))["params"]
  apply = jax.jit(model.apply)
  packed_out = apply({"params": params}, packed)
  alone_out = apply({"params": params}, alone)
  start = 0
  for index, length in enumerate(lengths):
    np.testing.assert_allclose(
        np.asarray(packed_out["mlm_logits"])[0, start:start + length],
        np.asarray(alone_out["mlm_logits"])[index, :length], atol=1e-5)
    start += length
  # Without isolation the same row computes something else: the test can fail.
  mixed = {**packed, "segment_ids": (packed["segment_ids"] > 0).astype(np.int32)}
  mixed_out = apply({"params": params}, mixed)
  assert np.abs(np.asarray(mixed_out["mlm_logits"])[0, :7]
                - np.asarray(alone_out["mlm_logits"])[0, :7]).max() > 1e-2


def _padding(config, seq_length, batches=30):
  config.data.seq_length = seq_length
  task = tasks.register_pretraining_task(config)
  return packing.padding_fraction(pipeline.take_batches(task, "train", seq_length, 16,
                                                        batches))


def test_full_sentences_waste_less_padding_than_doc_sentences_on_the_bundled_corpus(
    tiny_config):
  waste = {}
  for builder in ("full_sentences", "doc_sentences"):
    config = tiny_config()
    config.data.builder = builder
    config.objective.names = ("mlm",)
    config.model.embeddings.max_positions = 512
    waste[builder] = _padding(config, 512, batches=4)
  print(f"padding at length 512: {waste}")
  assert waste["full_sentences"] < waste["doc_sentences"]
  assert waste["full_sentences"] < 0.05


# --- best-fit packing (data.packing) -----------------------------------------------------
def test_best_fit_rows_hold_every_token_once_within_the_length_deterministically():
  rng = np.random.default_rng(2)
  documents = _documents([rng.integers(3, 30, rng.integers(1, 12)).tolist()
                          for _ in range(40)])
  packer = packing.SentencePacker(64, SPECIAL, cross_documents=True, packing="best_fit")
  rows = list(packer(documents, rng))
  pieces = {}
  for row in rows:
    real = row["segment_ids"] > 0
    assert real.sum() <= 64 and real[:real.sum()].all(), "padding only at the end"
    for _, ids in _sequences(row):  # [CLS] ... [SEP], positions restarting at 0
      document = set(ids // 10000)
      assert len(document) == 1, "a sequence is one document's"
      pieces.setdefault(document.pop(), []).append(ids.tolist())
  for document in documents:  # its pieces, in order, are its tokens: each once
    tokens = [t for s in document.sentences for t in s.tolist()]
    in_order = sorted(pieces[document.document_id], key=lambda piece: piece[0])
    assert [t for piece in in_order for t in piece] == tokens
  assert all(len(p) <= 62 for ps in pieces.values() for p in ps)
  same = list(packer(documents, np.random.default_rng(5)))  # no randomness: same rows
  assert all((a["input_ids"] == b["input_ids"]).all() for a, b in zip(rows, same))
  assert len(same) == len(rows)
  greedy = list(packing.SentencePacker(64, SPECIAL, cross_documents=True)(documents, rng))
  padding = [packing.padding_fraction(r) for r in (rows, greedy)]
  print(f"padding of 40 documents in rows of 64: best_fit {padding[0]:.1%}, greedy "
        f"{padding[1]:.1%}")
  assert padding[0] < padding[1] / 3


def test_best_fit_places_each_sequence_where_it_fits_most_tightly():
  sequence = lambda n: [(np.zeros(n - 2, np.int32), np.ones(n - 2, np.int32))]
  rows = packing.best_fit_rows([sequence(n) for n in (6, 9, 3, 5, 4)], 10)
  # Longest first: 9 opens a row (1 free), 6 another (4 free), 5 a third (5 free),
  # 4 fills the second's 4 exactly, 3 goes to the third (the tightest that holds it).
  assert [[packing.sequence_length(s) for s in row] for row in rows] == [[9], [6, 4], [5, 3]]


def test_best_fit_leaves_less_padding_than_greedy_over_an_epoch_of_the_bundled_corpus(
    tiny_config):
  from encoderx.tools.data import padding as padding_tool  # pylint: disable=g-import-not-at-top
  padding = {}
  for method in packing.PACKINGS:
    config = tiny_config()
    config.data.builder, config.data.packing = "full_sentences", method
    config.objective.names = ("mlm",)
    config.data.seq_length = 128
    padding[method], _ = padding_tool.epoch_padding(config)
  print(f"padding over an epoch of the bundled corpus at 128: {padding}")
  assert padding["best_fit"] < 0.01 < 0.1 < padding["greedy"]
  batches = [pipeline.take_batches(tasks.register_pretraining_task(config), "train", 128,
                                   8, 3, seed=4) for _ in range(2)]
  assert all((a["input_ids"] == b["input_ids"]).all() for a, b in zip(*batches))


def test_packing_is_checked(tiny_config):
  from encoderx import errors  # pylint: disable=g-import-not-at-top
  from encoderx.data import fields  # pylint: disable=g-import-not-at-top
  config = tiny_config()
  config.data.builder, config.data.packing = "full_sentences", "bestfit"
  with pytest.raises(errors.ConfigError, match="data.packing"):
    fields.validate(config.data)
  config.data.builder, config.data.packing = "doc_sentences", "best_fit"
  with pytest.raises(errors.ConfigError, match="full_sentences"):
    fields.validate(config.data)
