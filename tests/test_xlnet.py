"""XLNet: row streams, permutation masks, two-stream relative attention against Hugging
Face XLNetLMHeadModel, the memory as method state (reset, sharded, checkpointed), and a
tiny run that learns."""
import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest
import seqio

from encoderx import errors
from encoderx import config as config_lib
from encoderx.methods import registry as method_registry
from encoderx import train
from encoderx import configs
from encoderx.data import pipeline, row_streams, segment_pairs
from encoderx.hf import base, engine
from encoderx.models import common, pretraining, xlnet
from encoderx.objectives import plm
from encoderx.train import trainer as trainer_lib

from conftest import _tiny_config  # pylint: disable=g-bad-import-order  (tests/ on sys.path)
from reference_models import small_model, torch_reference  # pylint: disable=g-bad-import-order

torch = pytest.importorskip("torch")

ONE_DEVICE = jax.devices()[:1]
SPECIAL = segment_pairs.SpecialIds(pad=0, cls=2, sep=3)


def _config():
  """xlnet_tiny shrunk like the other tests' configs (conftest's _tiny_config); document
  sets of 8 chapters (the first batch comes sooner)."""
  config = _tiny_config("xlnet:tiny")
  config.data.document_pool = 8
  return config


def _method(config):
  return method_registry.build(config_lib.validate(config))


@pytest.fixture(scope="module")
def stream_batches():
  """The first 6 batches (8 rows of 64 tokens) of xlnet_tiny's train split."""
  config = _config()
  task = _method(config).task()
  return pipeline.take_batches(task, "train", 64, 8, 6, seed=3)


# --- row streams ---------------------------------------------------------------------------
def _documents(count=6, seed=0):
  """Documents whose token ids count up from 10 (so every token says where it came
  from), sentences of 3-12 tokens, words of 1-3 pieces."""
  rng, next_id, documents = np.random.default_rng(seed), 10, []
  for index in range(count):
    sentences, starts = [], []
    for _ in range(rng.integers(8, 20)):
      length = int(rng.integers(3, 13))
      sentences.append(np.arange(next_id, next_id + length, dtype=np.int32))
      word_starts = (rng.random(length) < 0.5).astype(np.int32)
      word_starts[0] = 1
      starts.append(word_starts)
      next_id += length
    documents.append(segment_pairs.Document(index, sentences, starts))
  return documents


def _segments(example):
  """(reused + A, B) ids of an example `reused A [SEP] B [SEP] [CLS]`."""
  types, ids = example["token_type_ids"], example["input_ids"]
  first, second = ids[types == 0], ids[types == 1]
  return first[:-1], second[:-1]


def test_rows_are_streams_of_consecutive_chunks_with_sep_and_cls_at_the_end():
  builder = row_streams.StreamBuilder(seq_length=40, reuse_len=16, rows=4, special=SPECIAL,
                                  bi_data=True)
  documents = _documents()
  examples = list(builder(documents, np.random.default_rng(1)))
  stream = row_streams.document_stream(documents, SPECIAL.sep)
  parts = builder.parts(stream)
  steps = builder.steps(len(parts[0]))
  assert len(examples) == steps * 4 and steps >= 5
  # The stream holds every document's tokens in order, a [SEP] after each.
  assert (stream.token_ids == SPECIAL.sep).sum() == len(documents)
  for step in range(steps):
    for row in range(4):
      example = examples[step * 4 + row]
      ids, types = example["input_ids"], example["token_type_ids"]
      assert len(ids) == 40 and (example["segment_ids"] == 1).all()
      assert ids[-1] == SPECIAL.cls and ids[-2] == SPECIAL.sep  # XLNet's order
      np.testing.assert_array_equal(types, np.sort(types))  # 0 ... 0 1 ... 1 2
      assert (types == 2).sum() == 1 and ids[np.argmax(types == 1) - 1] == SPECIAL.sep
      assert example["stream_start"] == (step == 0)
      assert example["reversed"] == (row >= 2)
      part = parts[row]
      reused_and_a, b = _segments(example)
      # The row continues its part: reused tokens, then A from where they end.
      begin = step * 16
      np.testing.assert_array_equal(reused_and_a, part.token_ids[begin:begin + len(
          reused_and_a)])
      # B is whole sentences from the part, starting at a sentence start.
      b_start = [s for s in range(len(part) - len(b) + 1)
                 if (part.token_ids[s:s + len(b)] == b).all()]
      assert b_start and part.sentence_starts[b_start[0]]
  # Backward rows read the forward rows' parts reversed.
  np.testing.assert_array_equal(parts[2].token_ids, parts[0].token_ids[::-1])
  first_word = parts[2].word_starts.astype(bool)
  # Reversed, a word starts at its last piece: the token before a forward word start.
  np.testing.assert_array_equal(first_word[1:], parts[0].word_starts[::-1][:-1] > 0)
  # The same documents and seed give the same rows.
  again = list(builder(documents, np.random.default_rng(1)))
  for a, b in zip(examples, again):
    for name in a:
      np.testing.assert_array_equal(a[name], b[name])


def test_the_task_streams_rows_deterministically_and_resumably(stream_batches):
  config = _config()
  task = _method(config).task()
  batches = stream_batches
  assert (batches[0]["stream_start"] == 1).all()
  assert not any(b["stream_start"].any() for b in batches[1:])
  np.testing.assert_array_equal(batches[0]["reversed"], [0, 0, 0, 0, 1, 1, 1, 1])
  reuse = config.objective.plm.reuse_len
  for previous, current in zip(batches, batches[1:]):
    for row in range(8):
      # The next row's reused tokens begin with this row's A (its continuation).
      a = _segments({k: v[row] for k, v in previous.items()})[0][reuse:]
      overlap = min(len(a), reuse)
      np.testing.assert_array_equal(current["input_ids"][row, :overlap], a[:overlap])
  # Restored at a position, the iterator continues with exactly the next batch.
  iterator = pipeline.BatchIterator(task, "train", 64, 8, seed=3,
                                    position=pipeline.DataPosition(0, 4))
  try:
    resumed = next(iterator)
  finally:
    iterator.close()
  for name, value in batches[4].items():
    np.testing.assert_array_equal(resumed[name], value)
  # The second of two processes streams its own documents, each row a stream.
  iterator = pipeline.BatchIterator(task, "train", 64, 8, seed=3,
                                    shard_info=seqio.ShardInfo(1, 2))
  try:
    first, second = next(iterator), next(iterator)
  finally:
    iterator.close()
  for row in range(8):
    a = _segments({k: v[row] for k, v in first.items()})[0][reuse:]
    np.testing.assert_array_equal(second["input_ids"][row, :min(len(a), reuse)],
                                  a[:min(len(a), reuse)])
  assert not np.isin(first["input_ids"][:, :8], batches[0]["input_ids"][:, :8]).all()


# --- permutation masks ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def prepared(stream_batches):
  """32 real rows, the tails of 4 of them padded, prepared twice with one key and once
  with another."""
  config = _method(_config()).plm_config
  batch = {k: np.concatenate([b[k] for b in stream_batches[:4]]) for k in
           stream_batches[0]}
  for row, length in zip(range(4), (60, 50, 41, 36)):
    for name in segment_pairs.TOKEN_FEATURES:
      batch[name][row, length:] = 0
  key = jax.random.fold_in(jax.random.key(7), 3)  # as the trainer keys (seed, step)
  run = jax.jit(lambda b, k: plm.prepare(b, k, config))
  return (config, batch, jax.device_get(run(batch, key)), jax.device_get(run(batch, key)),
          jax.device_get(run(batch, jax.random.fold_in(jax.random.key(7), 4))))


def test_permutation_masks_follow_xlnets_local_permutations(prepared):
  config, batch, first, again, other = prepared
  for name in ("perm_visible", "target_positions", "target_weights", "target_ids"):
    np.testing.assert_array_equal(first[name], again[name])  # a function of (seed, step)
  assert not np.array_equal(first["perm_visible"], other["perm_visible"])
  visible, reuse = first["perm_visible"], config.reuse_len
  real = batch["segment_ids"] > 0
  # No token sees padding.
  assert not (visible & ~real[:, None, :]).any()
  functional = np.isin(batch["input_ids"], config.functional_ids) & real
  for row in range(len(visible)):
    weights = first["target_weights"][row] > 0
    targets = np.zeros(64, bool)
    targets[first["target_positions"][row][weights]] = True
    np.testing.assert_array_equal(batch["input_ids"][row][targets],
                                  first["target_ids"][row][weights])
    sees = visible[row]
    # A target's query stream never sees itself; other tokens (content) do.
    assert not sees[targets, targets].any() and sees[~targets & real[row]].any()
    assert (np.diag(sees)[real[row]] == ~targets[real[row]]).all()
    for part in (np.arange(64) < reuse, np.arange(64) >= reuse):
      ordered = (targets | functional[row]) & part
      context = ~targets & ~functional[row] & part & real[row]
      # Every token of a part sees its context; the context sees no target.
      assert sees[np.ix_(part & real[row], context)].all()
      assert not sees[np.ix_(context, targets & part)].any()
      # The targets and [SEP]/[CLS] are totally ordered: each sees exactly the ones
      # before it (so a target sees its predecessors, never itself).
      index = np.flatnonzero(ordered)
      among = sees[np.ix_(index, index)] & ~np.eye(len(index), dtype=bool)
      earlier = among.sum(axis=1)
      np.testing.assert_array_equal(np.sort(earlier), np.arange(len(index)))
      np.testing.assert_array_equal(among, earlier[None, :] < earlier[:, None])
      # XLNet's local permutation: blocks of perm_size in order, and the same order
      # of slots in every block.
      block, slot = index // config.perm_size, index % config.perm_size
      in_order = np.argsort(earlier)
      assert (np.diff(block[in_order]) >= 0).all()
      slot_orders = [[s for b, s in zip(block[in_order], slot[in_order]) if b == which]
                     for which in np.unique(block)]
      for order_a in slot_orders:
        for order_b in slot_orders:
          assert [s for s in order_a if s in order_b] == [s for s in order_b if s in order_a]
    # The reused part sees nothing of the rest; the rest sees all of the reused part.
    rest, reused = np.arange(64) >= reuse, np.arange(64) < reuse
    assert not sees[np.ix_(reused, rest)].any()
    assert sees[np.ix_(rest & real[row], reused & real[row])].all()


def _runs(chosen: np.ndarray, cut: int) -> list[tuple[int, int]]:
  """[start, end) of the runs of True, also cut at position `cut`."""
  edges = np.diff(np.concatenate([[0], chosen.astype(int), [0]]))
  runs = zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1))
  return [piece for start, end in runs for piece in (
      [(start, cut), (cut, end)] if start < cut < end else [(start, end)])]


def test_predictions_are_whole_word_spans_covering_one_in_k(prepared):
  config, batch, first, _, _ = prepared
  candidates = ~np.isin(batch["input_ids"], config.special_ids) & (batch["segment_ids"] > 0)
  share = first["target_weights"].sum() / candidates.sum()
  assert abs(share - 1 / config.prediction_k) < 0.01, share
  reuse, lengths = config.reuse_len, []
  for row in range(len(candidates)):
    targets = np.zeros(64, bool)
    targets[first["target_positions"][row][first["target_weights"][row] > 0]] = True
    assert targets[:reuse].any() and targets[reuse:].any()  # both parts predict
    # Spans of whole words (the part boundary starts a word), 1..max_span_words long.
    word_starts = (batch["word_starts"][row].astype(bool) | (np.arange(64) == reuse)
                   | (batch["segment_ids"][row] == 0))
    for start, end in _runs(targets, reuse):
      assert word_starts[start] and (end == 64 or word_starts[end])
      lengths.append(word_starts[start:end].sum())
  assert max(lengths) <= config.max_span_words
  # p(n) ∝ 1/n on 1..5: 44% of spans are one word (units that touch count as one here).
  assert 0.3 < np.mean(np.array(lengths) == 1) < 0.6 and max(lengths) > 2


# --- parity with Hugging Face XLNetLMHeadModel ---------------------------------------------
MODEL = small_model(family="xlnet", attention=dict(variant="two_stream_relative"), embeddings=dict(position="none", type_vocab_size=0, layer_norm=False, max_positions=0))


@pytest.fixture(scope="module")
def torch_xlnet():
  return torch_reference(MODEL, "xlnet")


def _model_and_params(config, torch_model):
  model = xlnet.PermutationLanguageModel(config)
  expected = jax.eval_shape(lambda: model.init(jax.random.key(0), xlnet.init_batch(1, 8, 2))
                            )["params"]
  return model, engine.from_hf(torch_model.state_dict(), config, family="xlnet",
                               expected=expected)


def _two_stream_batch(seed, lengths=(40, 31, 17, 40), predictions=6):
  """(numpy batch for encoderx, keyword arguments for Hugging Face): padded rows with
  XLNet's token types (A, B, [CLS] last), a random permutation mask, `predictions`
  targets per row (the third row uses 4: its last slots are unused)."""
  rng = np.random.default_rng(seed)
  length = max(lengths)
  real = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
  ids = np.where(real, rng.integers(5, MODEL.vocab_size, real.shape), 0)
  types = (np.arange(length)[None, :] >= np.asarray(lengths)[:, None] // 2).astype(int)
  types[np.arange(4), np.asarray(lengths) - 1] = 2
  types = types * real
  hidden_from = rng.random((4, length, length)) < 0.5  # Hugging Face: 1 = may not see
  positions = np.stack([np.sort(rng.choice(n, predictions, replace=False)) for n in lengths])
  weights = np.ones((4, predictions), np.float32)
  weights[2, 4:] = 0
  mapping = np.zeros((4, predictions, length), np.float32)
  for row, slot in zip(*np.nonzero(weights)):
    mapping[row, slot, positions[row, slot]] = 1.0
  batch = dict(input_ids=ids.astype(np.int32), token_type_ids=types.astype(np.int32),
               segment_ids=real.astype(np.int32),
               positions=np.tile(np.arange(length, dtype=np.int32), (4, 1)),
               perm_visible=~hidden_from, target_positions=positions.astype(np.int32),
               target_weights=weights)
  as_tensor = lambda x: torch.tensor(np.asarray(x))
  theirs = dict(input_ids=as_tensor(ids), attention_mask=as_tensor(real.astype(np.float32)),
                token_type_ids=as_tensor(types),
                perm_mask=as_tensor(hidden_from.astype(np.float32)),
                target_mapping=as_tensor(mapping), use_mems=True)
  return batch, theirs


@pytest.mark.parametrize("scan_layers,bi_data", [(False, False), (True, True)])
def test_logits_and_memory_match_xlnet_lm_head_model(torch_xlnet, scan_layers, bi_data):
  """Two consecutive segments: the second attends to the memory of the first (what
  entered each layer), as Hugging Face's `mems`; with bidirectional data the second half
  of the batch reads backwards (Hugging Face's bi_data halves)."""
  config = MODEL.replace(layout=dict(scan=scan_layers))
  model, params = _model_and_params(config, torch_xlnet)
  torch_xlnet.transformer.bi_data = bi_data
  apply = jax.jit(model.apply)
  memory, theirs_memory, differences = None, None, []
  for segment in range(2):
    batch, theirs_inputs = _two_stream_batch(seed=segment)
    if bi_data:
      batch["reversed"] = np.array([0, 0, 1, 1], bool)
    with torch.no_grad():
      theirs = torch_xlnet(**theirs_inputs, mems=theirs_memory)
    ours = apply({"params": params}, batch, memory)
    real = batch["target_weights"] > 0
    logits = theirs.logits.numpy()
    differences.append(np.abs(np.asarray(ours["logits"]) - logits)[real].max())
    assert np.abs(logits).max() > 1.0  # not trivially small
    # What entered each layer: the end of Hugging Face's mems (which keep everything).
    layer_inputs = np.asarray(ours["layer_inputs"])
    theirs_memory = theirs.mems
    expected = np.stack([m.numpy().transpose(1, 0, 2) for m in theirs.mems])
    kept = batch["segment_ids"] > 0
    np.testing.assert_allclose(layer_inputs[:, kept],
                               expected[:, :, -kept.shape[1]:][:, kept], atol=1e-4)
    memory = {"hidden": np.moveaxis(expected, 0, 1), "valid": np.ones(kept.shape, bool)}
  torch_xlnet.transformer.bi_data = False
  print(f"XLNetLMHeadModel parity (scan={scan_layers}, bi_data={bi_data}): max abs "
        f"{differences[0]:.2e} (first segment), {differences[1]:.2e} (with its memory)")
  assert max(differences) <= 1e-4, differences


def test_content_stream_alone_matches_xlnet_model(torch_xlnet):
  """Without a query stream (fine-tuning): the encoder's output is XLNetModel's."""
  encoder_model = pretraining.EncoderModel(MODEL, with_pooler=False)
  _, params = _model_and_params(MODEL, torch_xlnet)
  batch, theirs_inputs = _two_stream_batch(seed=5)
  with torch.no_grad():
    theirs = torch_xlnet.transformer(
        input_ids=theirs_inputs["input_ids"], attention_mask=theirs_inputs["attention_mask"],
        token_type_ids=theirs_inputs["token_type_ids"]).last_hidden_state.numpy()
  ours = encoder_model.apply({"params": params["encoder_model"]}, batch)["hidden"]
  real = batch["segment_ids"] > 0
  assert np.abs(np.asarray(ours) - theirs)[real].max() <= 1e-4


def test_conversion_round_trips_exactly_both_ways(torch_xlnet):
  _, params = _model_and_params(MODEL.replace(layout=dict(scan=True)), torch_xlnet)
  state_dict = engine.to_hf(params, MODEL.replace(layout=dict(scan=True)), "xlnet")
  reference = torch_xlnet.state_dict()
  assert set(state_dict) == set(reference) - {"lm_loss.weight"}  # tied to the embedding
  for name, value in state_dict.items():
    np.testing.assert_array_equal(value, reference[name].numpy(), err_msg=name)
  # Our own initialization out to Hugging Face and back.
  model = xlnet.PermutationLanguageModel(MODEL)
  ours = jax.device_get(nn.unbox(jax.jit(model.init)(jax.random.key(1),
                                                      xlnet.init_batch(1, 8, 2))["params"]))
  fresh = engine.hf_pretraining_model(MODEL, "xlnet").eval()
  missing, unexpected = fresh.load_state_dict(
      {k: torch.tensor(v) for k, v in engine.to_hf(ours, MODEL, "xlnet").items()},
      strict=False)
  assert missing == ["lm_loss.weight"] and not unexpected
  back = engine.from_hf(fresh.state_dict(), MODEL, family="xlnet")
  jax.tree_util.tree_map(np.testing.assert_array_equal, back, ours)
  # The config too: Hugging Face's XLNetConfig gives back the same model fields.
  family, fields = engine.model_fields(engine.hf_config(MODEL, "xlnet").to_dict())
  assert family == "xlnet"
  for name, value in fields.items():
    assert MODEL.field(name) == value, name


def test_hugging_face_xlnet_configs_encoderx_cannot_represent_are_refused():
  """(tests/test_export.py runs the checks every family passes for XLNet too.)"""
  for change, message in ((dict(attn_type="uni"), "attn_type 'uni'"),
                          (dict(untie_r=False), "untie_r=False")):
    with pytest.raises(base.ConversionError, match=message):
      engine.model_fields(engine.hf_config(MODEL, "xlnet", **change).to_dict())


# --- the memory, training ------------------------------------------------------------------
def test_the_memory_keeps_the_reused_part_and_forgets_at_a_new_document_set():
  """What enters each layer (the model's `layer_inputs`, parity-tested against Hugging
  Face's mems above) at a row's reused positions joins the memory; rows whose stream
  starts a document set forget theirs first."""
  method = _method(_config())  # memory of 48, 32 reused tokens, 2 layers of 32
  state = nn.unbox(jax.eval_shape(method.init, jax.random.key(0))["state"])
  assert state["hidden"].shape == (8, 2, 48, 32) and state["valid"].shape == (8, 48)
  state = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), state)
  batch = {"stream_start": np.zeros(8, np.int32),
           "segment_ids": np.ones((8, 64), np.int32)}
  batch["segment_ids"][5, 20:] = 0  # padding is not remembered: 20 + 4 of the last 48
  for step in range(3):
    layer_inputs = np.full((2, 8, 64, 32), step + 1.0, np.float32)  # [layers, rows, ...]
    memory = method._memory(state, batch)
    state = jax.device_get(method._next_memory(memory, layer_inputs, batch))
    assert (state["hidden"][:, :, -32:] == step + 1).all()  # this step's reused part
    if step:
      assert (state["hidden"][:, :, -48:-32] == step).all()  # the newest 16 of the last
  np.testing.assert_array_equal(state["valid"].sum(axis=1), [48] * 5 + [24] + [48] * 2)
  batch["stream_start"] = np.array([1, 0] * 4, np.int32)
  forgotten = method._memory(state, batch)
  np.testing.assert_array_equal(np.asarray(forgotten["valid"]).sum(axis=1),
                                [0, 48, 0, 48, 0, 24, 0, 48])
  assert not np.asarray(forgotten["hidden"])[0].any()


def _run_config():
  """The one config of the training tests (each compiles the train step once)."""
  config = _config()
  config.train.steps = 30
  config.optimizer.learning_rate = 3e-3
  config.optimizer.warmup_steps = 3
  config.checkpoint.every_steps = 100  # only the stop and the end save
  config.eval.batches = 1
  return config


def test_mesh_2x2x2_with_the_memory_matches_one_device(stream_batches):
  config = _run_config()  # dropout on: masks and dropout do not depend on the devices
  results = {}
  for mesh in ((1, 1, 1), (2, 2, 2)):
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh
    trainer = trainer_lib.Trainer(config, devices=ONE_DEVICE if mesh == (1, 1, 1) else None)
    state, step, losses = trainer.init_state(), trainer.train_step(0), []
    for batch in stream_batches[:3]:
      state, metrics = step(state, trainer.device_batch(batch))
      losses.append(float(metrics["loss"]))
    results[mesh] = losses, jax.device_get(state.method_state), state.method_state
  # The memory is sharded like the batch: rows over the data-parallel axes.
  assert results[(2, 2, 2)][2]["hidden"].sharding.spec[0] == ("data", "fsdp")
  single, sharded = results[(1, 1, 1)], results[(2, 2, 2)]
  np.testing.assert_allclose(sharded[0], single[0], atol=1e-5)
  assert single[0][0] != single[0][2]
  np.testing.assert_allclose(sharded[1]["hidden"], single[1]["hidden"], atol=1e-4)
  np.testing.assert_array_equal(sharded[1]["valid"], single[1]["valid"])
  assert single[1]["valid"].all()  # 3 steps of 32 fill the 48 slots


def _run(config, workdir, **kwargs):
  return train.run(config, str(workdir), show_progress=False, devices=ONE_DEVICE, **kwargs)


def test_stop_and_resume_equals_running_straight_and_the_tiny_xlnet_learns(tmp_path):
  config = _run_config()
  straight = _run(config, tmp_path / "straight")
  first = _run(config, tmp_path / "resumed", stop_at_step=12)
  second = _run(config, tmp_path / "resumed", resume=True)
  assert first["stopped"] and second["step"] == 30
  losses = {h["step"]: h["loss"] for h in first["history"] + second["history"]}
  np.testing.assert_array_equal([losses[s] for s in range(1, 31)],
                                [h["loss"] for h in straight["history"]])
  # The memory was checkpointed and restored with the run.
  np.testing.assert_array_equal(np.asarray(second["method_state"]["hidden"]),
                                np.asarray(straight["method_state"]["hidden"]))
  assert second["eval"] == pytest.approx(straight["eval"])
  assert set(straight["eval"]) == {"plm_loss", "plm_accuracy", "plm_perplexity"}
  history = straight["history"]
  first_loss, last = history[0]["plm_loss"], np.mean([h["plm_loss"] for h in history[-5:]])
  assert last < first_loss - 1.0, (first_loss, last)  # 8.98 (uniform) to 7.7 measured


# --- configs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("change,message", [
    (lambda c: setattr(c.model.attention, "variant", "standard"),
     "xlnet needs 'two_stream_relative'"),
    (lambda c: setattr(c.objective.plm, "reuse_len", 61), "leaves no room"),
    (lambda c: setattr(c.train, "batch_size", 7), "must be even"),
    (lambda c: setattr(c.model.embeddings, "type_vocab_size", 2), "3 token types"),
    (lambda c: setattr(c.train, "long_fraction", 0.1), "one length"),
])
def test_bad_xlnet_settings_fail_with_the_field(change, message):
  config = _config()
  change(config)
  with pytest.raises(errors.ConfigError, match=message):
    config_lib.validate(config)


def test_configs_carry_the_papers_sizes():
  for variant, sizes in (("base", (12, 768, 12, 3072)), ("large", (24, 1024, 16, 4096)),
                         ("tiny", (2, 128, 2, 512))):
    config = config_lib.validate(configs.get(f"xlnet:{variant}"))
    model = config.model
    assert (model.num_layers, model.hidden_size, model.num_heads,
            model.intermediate_size) == sizes
  large = configs.get("xlnet:large")
  assert (large.data.seq_length, large.objective.plm.reuse_len, large.objective.plm.mem_len,
          large.objective.plm.num_predict, large.train.batch_size) == (512, 256, 384, 85, 8192)
