"""ALBERT: SentencePiece vocabulary, sentence-order pairs, parity with Hugging Face
AlbertForPreTraining, parameter counts, LAMB, configs and a tiny pretraining run."""
import dataclasses
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import seqio
import sentencepiece
import tensorflow as tf

from encoderx import errors
from encoderx import config as config_lib
from encoderx import optim, train
from encoderx import configs
from encoderx.data import corpus, example_builders, pipeline, segment_pairs, tasks
from encoderx.data import sentencepiece_vocabulary as spm_lib
from encoderx.data.vocabulary import VocabularyError
from encoderx.hf import engine
from encoderx.models import model_config as model_config_lib
from encoderx.models import pretraining
from encoderx.data import resources

from reference_models import (  # pylint: disable=g-bad-import-order  (tests/ is on sys.path)
    check_round_trip, flax_from_torch, mlm_logits, padded_batch, small_model,
    torch_outputs, torch_reference)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

AUSTEN_CHAPTERS = r"^\s*(CHAPTER|Chapter)\s+[0-9IVXLC]+"


# --- SentencePiece vocabulary -------------------------------------------------------------
@pytest.fixture(scope="module")
def trained_model(tmp_path_factory, austen_files):
  """A 4,000-piece model trained on the bundled corpus through the command line."""
  prefix = tmp_path_factory.mktemp("spm") / "austen"
  spm_lib.main(["--files", ",".join(austen_files), "--size", "4000",
                "--output", str(prefix)])
  return f"{prefix}.model"


def _hf_albert_tokenizer(model_file, directory):
  """AlbertTokenizer that really reads `model_file`: in transformers 5,
  AlbertTokenizer(vocab_file=...) ignores the file (5 tokens); from_pretrained on a
  directory with spiece.model converts it."""
  shutil.copy(model_file, directory / "spiece.model")
  return transformers.AlbertTokenizer.from_pretrained(str(directory))


def _lines(files, count):
  lines = [line.strip() for path in files for line in open(path, encoding="utf-8")
           if line.strip()]
  return lines[::max(len(lines) // count, 1)][:count]


@pytest.mark.parametrize("model", ["trained", "bundled"])
def test_sentencepiece_ids_equal_hugging_face_albert_tokenizer(
    model, trained_model, austen_files, tmp_path):
  path = trained_model if model == "trained" else resources.BUNDLED_SENTENCEPIECE_VOCAB
  vocabulary = spm_lib.SentencePieceVocabulary(path)
  theirs_tokenizer = _hf_albert_tokenizer(vocabulary.path, tmp_path)
  assert len(theirs_tokenizer) == vocabulary.vocab_size == (4000 if model == "trained"
                                                           else 8000)
  lines = _lines(austen_files, 2000) + [
      "Héllo WÖRLD, naïve café!", "``Quoted'' and “curly” text", "ß İstanbul ǅ ﬁ ①",
      "Ｆｕｌｌ－ｗｉｄｔｈ\tand  spaces", "in 1811, £10,000 a year", "中文 and 日本"]
  ours = vocabulary.encode_tf(tf.constant(lines)).to_list()
  theirs = [theirs_tokenizer.encode(line, add_special_tokens=False) for line in lines]
  mismatches = [(line, a, b) for line, a, b in zip(lines, ours, theirs) if a != b]
  assert not mismatches, mismatches[:3]
  assert sum(map(len, ours)) > 20_000


def test_sentencepiece_interface_and_word_grouping():
  vocabulary = spm_lib.SentencePieceVocabulary(resources.BUNDLED_SENTENCEPIECE_VOCAB)
  assert (vocabulary.pad_id, vocabulary.unk_id, vocabulary.cls_id, vocabulary.sep_id,
          vocabulary.mask_id) == (0, 1, 2, 3, 4)
  assert vocabulary.eos_id is None and vocabulary.bos_id is None
  assert vocabulary.special_ids == (0, 1, 2, 3, 4)
  assert [vocabulary.id_to_token(i) for i in range(5)] == [
      "<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
  assert vocabulary.token_to_id("▁the") == vocabulary.encode("the")[0]
  with pytest.raises(KeyError):
    vocabulary.token_to_id("no such piece")

  text = "Mr. Darcy's unaccountable partiality"
  words = vocabulary.tokenize_words_tf(text).to_list()  # scalar -> [words, pieces]
  assert len(words) == 4
  assert [vocabulary.id_to_token(w[0])[0] for w in words] == ["▁"] * 4
  assert all(not vocabulary.id_to_token(p).startswith("▁") for w in words for p in w[1:])
  assert sum(words, []) == vocabulary.encode(text)
  assert vocabulary.decode(vocabulary.encode(text)) == text.lower()
  batch = vocabulary.tokenize_words_tf(tf.constant([text, "", "Anne"])).to_list()
  assert batch[0] == words and batch[1] == [] and len(batch[2]) == 1
  # The seqio Task's vocabulary is chosen by config.data.vocab.kind.
  config = configs.get("albert:tiny")
  assert tasks.build_vocabulary(config.data.vocab) == vocabulary


def test_bad_sentencepiece_files_fail_clearly(tmp_path, austen_files):
  with pytest.raises(VocabularyError, match="cannot read SentencePiece model"):
    spm_lib.SentencePieceVocabulary(str(tmp_path / "missing.model"))
  with pytest.raises(VocabularyError, match="cannot read SentencePiece model"):
    spm_lib.SentencePieceVocabulary("bundled:austen-wordpiece")  # a vocab.txt
  prefix = tmp_path / "plain"  # SentencePiece's defaults: no [CLS] [SEP] [MASK] <pad>
  sentencepiece.SentencePieceTrainer.train(input=austen_files[:1], model_prefix=str(prefix),
                                           vocab_size=500, minloglevel=2)
  with pytest.raises(VocabularyError, match=r"lacks the special pieces \['\[CLS\]'"):
    spm_lib.SentencePieceVocabulary(f"{prefix}.model")
  empty = tmp_path / "empty.txt"
  empty.write_text("\n  \n")
  with pytest.raises(VocabularyError, match="no text"):
    spm_lib.train_sentencepiece([str(empty)], str(tmp_path / "out"), vocab_size=100)
  with pytest.raises(VocabularyError, match="no such file"):
    spm_lib.train_sentencepiece([str(tmp_path / "none.txt")], str(tmp_path / "out"))
  with pytest.raises(VocabularyError, match="Vocabulary size too high"):
    spm_lib.train_sentencepiece(austen_files[:1], str(tmp_path / "out"), vocab_size=90000)
  assert not list(tmp_path.glob("out*"))  # nothing half-written
  config = configs.get("albert:tiny")
  config.data.vocab.path = str(tmp_path / "missing.model")
  with pytest.raises(errors.ConfigError,
                     match=r"data\.vocab\.path.*encoderx\.data\.sentencepiece_vocabulary"):
    config_lib.validate(config)


# --- Sentence-order prediction --------------------------------------------------------------
SPECIAL = segment_pairs.SpecialIds(pad=0, cls=2, sep=3)
POSITIONS_PER_DOCUMENT = 1_000_000


@pytest.fixture(scope="module")
def austen_documents():
  """The bundled chapters tokenized as the Task does, with every token id replaced by
  its document's number * 1e6 + its position, so pairs show where they came from."""
  vocabulary = spm_lib.SentencePieceVocabulary(resources.BUNDLED_SENTENCEPIECE_VOCAB)
  chapters = list(corpus.read_documents(
      tasks.corpus_files(configs.get("albert:tiny").data),
      corpus.CorpusFormat(document_marker=AUSTEN_CHAPTERS)))
  dataset = tf.data.Dataset.from_tensor_slices({
      "text": ["\n".join(blocks) for blocks in chapters],
      "document_id": np.arange(len(chapters))})
  features = {"input_ids": seqio.Feature(vocabulary)}
  documents = []
  for example in example_builders.tokenize_documents(dataset, features, False).as_numpy_iterator():
    positions = (POSITIONS_PER_DOCUMENT * (example["document_id"] + 1)
                 + np.arange(len(example["token_ids"]))).astype(np.int64)
    documents.append(segment_pairs.Document.from_flat(
        example["document_id"], positions, example["word_starts"],
        example["sentence_lengths"]))
  return documents


def _segments(example):
  ids = example["input_ids"]
  n = int(example["segment_ids"].sum())
  seps = np.flatnonzero(ids[:n] == SPECIAL.sep)
  assert ids[0] == SPECIAL.cls and len(seps) == 2 and seps[1] == n - 1
  types = example["token_type_ids"]
  assert (types[:seps[0] + 1] == 0).all() and (types[seps[0] + 1:n] == 1).all()
  return ids[1:seps[0]], ids[seps[0] + 1:seps[1]]


def test_sop_pairs_on_the_bundled_corpus(austen_documents):
  seq_length = 128
  builder = segment_pairs.SentencePairBuilder(seq_length, short_seq_prob=0.1,
                                              special=SPECIAL, label_mode="sop")
  examples = []
  for group in range(0, len(austen_documents), 20):  # as the Task groups documents
    examples += builder(austen_documents[group:group + 20], np.random.default_rng(group))
  labels = np.array([e["sentence_label"] for e in examples])
  n = len(labels)
  assert n > 1500
  assert abs(labels.mean() - 0.5) < 3 * np.sqrt(0.25 / n), (labels.mean(), n)

  untruncated = 0
  for example, label in zip(examples, labels):
    first, second = _segments(example)
    assert len(first) and len(second)
    # In order, the pair is (A, B); swapped, it is (B, A): put it back in order.
    a, b = (first, second) if label == segment_pairs.IN_ORDER else (second, first)
    documents = set(np.concatenate([a, b]) // POSITIONS_PER_DOCUMENT)
    assert len(documents) == 1, "A and B come from one document"
    assert (np.diff(a) == 1).all() and (np.diff(b) == 1).all(), "each is one stretch"
    assert a[-1] < b[0], "A comes before B in the document"
    if len(a) + len(b) < seq_length - 3:  # not truncated: B starts where A ends
      assert b[0] == a[-1] + 1
      untruncated += 1
  assert untruncated > 100


def test_one_sentence_documents_make_sop_pairs_split_at_a_word():
  documents = [segment_pairs.Document(d, [np.arange(9) + 100 * d],
                                      [np.array([1, 0, 1, 1, 0, 0, 1, 1, 0])])
               for d in range(1, 101)]
  builder = segment_pairs.SentencePairBuilder(32, 0.0, SPECIAL, label_mode="sop")
  examples = list(builder(documents, np.random.default_rng(0)))
  assert len(examples) == 100
  for example in examples:
    first, second = _segments(example)
    a, b = ((first, second) if example["sentence_label"] == segment_pairs.IN_ORDER
            else (second, first))
    assert b[0] == a[-1] + 1 and a[0] % 100 == 0 and b[-1] % 100 == 8
    assert b[0] % 100 in (2, 3, 6, 7), "split where a word starts"
  assert 30 < sum(e["sentence_label"] for e in examples) < 70


def _sentence_word(document: int, sentence: int) -> str:
  """A word naming its document and sentence, in letters (the Austen SentencePiece model
  has no piece for some digits): z<document><sentence, two letters>q."""
  return f"z{'abcdef'[document]}{chr(97 + sentence // 26)}{chr(97 + sentence % 26)}q"


def test_sop_objective_selects_sop_pairs_in_the_task(tiny_config, write_corpus):
  path = write_corpus([[f"{_sentence_word(d, s)} is here." for s in range(40)]
                       for d in range(6)])
  config = tiny_config("albert:tiny")
  config.data.files = str(path)
  config.data.document_marker = ""
  config.data.sentence_per_line = True
  config.data.eval_every_nth_document = 3
  assert tasks.sentence_objective(config) == "sop"
  vocabulary = tasks.build_vocabulary(config.data.vocab)
  task = tasks.register_pretraining_task(config)
  nsp = config.copy_and_resolve_references()
  nsp.objective.names = ("mlm", "nsp")
  assert task.name != tasks.task_name(nsp)
  examples = [{k: v[row] for k, v in batch.items()}
              for batch in pipeline.take_batches(task, "train", 64, 8, 5) for row in range(8)]
  for example in examples:
    where = [[(word[1], word[2:4]) for word in vocabulary.decode(segment.tolist()).split()
              if len(word) == 5 and word[0] == "z" and word[-1] == "q"]
             for segment in _segments(example)]
    assert len({document for document, _ in where[0] + where[1]}) == 1, where
    if where[0] and where[1]:  # sentence keys sort like sentence numbers
      in_order = max(key for _, key in where[0]) < min(key for _, key in where[1])
      assert in_order == (example["sentence_label"] == segment_pairs.IN_ORDER), where
  assert 0 < np.mean([e["sentence_label"] for e in examples]) < 1
  # SOP reads no other document: a split of one document is enough, unlike NSP.
  config.data.eval_every_nth_document = 2
  two = write_corpus([["One document.", "Of two sentences."],
                      ["A held-out one.", "Also of two."]], name="two.txt")
  config.data.files = nsp.data.files = str(two)
  nsp.data.eval_every_nth_document = 2
  assert tasks.check_text_corpus(config) == {"train": 1, "validation": 1}
  with pytest.raises(corpus.CorpusError, match="for nsp need at least 2"):
    tasks.check_text_corpus(nsp)
  config.data.eval_every_nth_document = 3  # the validation split is empty
  with pytest.raises(corpus.CorpusError, match="validation split .* need at least 1"):
    tasks.check_text_corpus(config)


# --- Parity with Hugging Face AlbertForPreTraining ------------------------------------------
MODEL = small_model(embeddings=dict(size=16), hidden_act="gelu_new", layout=dict(sharing="all"))


@pytest.mark.parametrize("layer_sharing", ["all", "none"])
def test_mlm_and_sop_logits_match_albert_for_pretraining(layer_sharing):
  model_config = MODEL.replace(layout=dict(sharing=layer_sharing))
  torch_model = torch_reference(model_config, "albert")
  model, params = flax_from_torch(model_config, torch_model, family="albert")
  shared = params["encoder_model"]["encoder"]
  assert set(shared) == ({"shared_layer"} if layer_sharing == "all"
                         else {"layer_0", "layer_1", "layer_2"})
  real, batch = padded_batch(MODEL.vocab_size)
  theirs = torch_outputs(torch_model, batch)
  ours = model.apply({"params": params}, {k: jnp.asarray(v) for k, v in batch.items()})
  mlm_diff = np.abs(np.asarray(ours["mlm_logits"])[real] - mlm_logits(theirs)[real]).max()
  sop_diff = np.abs(np.asarray(ours["sentence_logits"]) - theirs.sop_logits.numpy()).max()
  print(f"ALBERT parity ({layer_sharing}): MLM max abs {mlm_diff:.2e}, "
        f"SOP max abs {sop_diff:.2e}")
  assert mlm_diff <= 1e-4 and sop_diff <= 1e-4, (mlm_diff, sop_diff)
  assert np.abs(theirs.prediction_logits.numpy()).max() > 1.0  # not trivially small
  assert np.abs(theirs.sop_logits.numpy()).max() > 0.1


def test_albert_conversion_round_trips_exactly():
  torch_model = torch_reference(MODEL, "albert")
  _, params = flax_from_torch(MODEL, torch_model, family="albert")
  check_round_trip(engine.to_hf(params, MODEL, family="albert"), torch_model, MODEL,
                   "albert", tied={"predictions.decoder.weight", "predictions.decoder.bias"})
  with pytest.raises(ValueError, match="no Hugging Face ALBERT equivalent"):
    engine.to_hf(params, MODEL.replace(layout=dict(sharing="ffn")), family="albert")
  with pytest.raises(ValueError, match="no Hugging Face conversion rules for family 'albret'"):
    engine.to_hf(params, MODEL, family="albret")


# --- Parameter counts, configs, LAMB ----------------------------------------------------------
def _parameter_count(model_config) -> int:
  model = pretraining.PretrainingModel(model_config)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0),
                                             pretraining.init_batch(1, 8, 2)))
  return pretraining.count_params(shapes["params"])


def test_albert_base_has_about_12m_parameters():
  config = configs.get("albert:base")
  config_lib.validate(config)
  model_config = model_config_lib.ModelConfig.from_config(config.model)
  counts = {sharing: _parameter_count(model_config.replace(layout=dict(sharing=sharing)))
            for sharing in ("all", "ffn", "attention", "none")}
  print("albert_base parameters: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
  assert 11_000_000 < counts["all"] < 12_500_000
  assert counts["all"] < counts["ffn"] < counts["none"]
  assert counts["all"] < counts["attention"] < counts["none"]
  assert counts["none"] > 80_000_000  # BERT-base-sized without sharing


def test_albert_configs_carry_the_paper_recipe():
  config = config_lib.validate(configs.get("albert:base"))
  model = config.model
  assert (model.vocab_size, model.embeddings.size, model.hidden_size, model.num_layers,
          model.num_heads, model.intermediate_size) == (30000, 128, 768, 12, 12, 3072)
  assert (model.layout.sharing, model.hidden_act, model.embeddings.max_positions) == (
      "all", "gelu_new", 512)
  assert (config.data.vocab.kind, config.data.seq_length) == ("sentencepiece", 512)
  assert (config.train.batch_size, config.train.steps) == (4096, 125_000)
  assert (config.optimizer.name, config.optimizer.learning_rate) == ("lamb", 0.00176)
  assert tuple(config.objective.names) == ("mlm", "sop")
  tiny = config_lib.validate(configs.get("albert:tiny"))
  assert tiny.data.vocab.path == resources.BUNDLED_SENTENCEPIECE_VOCAB
  bad = configs.get("albert:tiny")
  bad.optimizer.name = "lamb2"
  with pytest.raises(errors.ConfigError, match=r"optimizer\.name.*'adamw', 'lamb'"):
    config_lib.validate(bad)


def test_lamb_scales_each_update_to_the_learning_rate_times_the_weight_norm_but_biases():
  config = configs.get("albert:tiny").optimizer
  config.warmup_steps = 0
  params = {"dense": {"kernel": jnp.full((4, 3), 0.5), "bias": jnp.full(3, 2.0)}}
  grads = {"dense": {"kernel": jnp.arange(12.0).reshape(4, 3) - 5, "bias": jnp.ones(3)}}
  norms = {}
  for name in ("lamb", "adamw"):
    config.name = name
    optimizer = optim.build(config, total_steps=100)
    state = optimizer.init(params)
    for _ in range(2):  # the second update, at learning rate schedule(1)
      updates, state = jax.jit(optimizer.update)(grads, state, params)
    norms[name] = {k: float(optax.tree.norm(v)) for k, v in updates["dense"].items()}
  learning_rate = float(optim.learning_rate_schedule(config, 100)(1))
  expected = learning_rate * float(optax.tree.norm(params["dense"]["kernel"]))
  # Trust ratio ||w|| / ||u||: the kernel's update is learning rate x its norm.
  assert norms["lamb"]["kernel"] == pytest.approx(expected, rel=1e-5)
  assert norms["adamw"]["kernel"] != pytest.approx(expected, rel=0.1)
  # Biases (and LayerNorms) are left out of the layer-wise scaling, as in ALBERT: the
  # bias gets Adam's update (about 1 per element for a constant gradient), not
  # learning rate x ||bias||.
  assert norms["lamb"]["bias"] == pytest.approx(learning_rate * np.sqrt(3), rel=1e-3)
  assert norms["lamb"]["bias"] != pytest.approx(
      learning_rate * float(optax.tree.norm(params["dense"]["bias"])), rel=0.1)


# --- Pretraining -----------------------------------------------------------------------------
def test_tiny_albert_pretrains_on_the_bundled_corpus(tiny_config, tmp_path):
  config = tiny_config("albert:tiny")
  config.model.embeddings.size = 16
  config.train.steps = 30
  config.optimizer.warmup_steps = 3
  config.optimizer.learning_rate = 0.1  # LAMB: steps of 10% of a layer's norm
  result = train.run(config, str(tmp_path), show_progress=False, devices=jax.devices()[:1])
  history = result["history"]
  assert history[-1]["step"] == 30
  assert np.mean([h["mlm_loss"] for h in history[-5:]]) < history[0]["mlm_loss"] - 1.0
  assert set(result["eval"]) >= {"mlm_loss", "mlm_accuracy", "sop_accuracy"}
  params = result["params"]["encoder_model"]
  assert set(params["encoder"]) == {"shared_layer"}
  assert params["embeddings"]["word_embeddings"]["embedding"].shape == (8000, 16)
