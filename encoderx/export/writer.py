"""A run's parameters as a Hugging Face model directory, or as a numpy .npz.

    export_hf(workdir, output, step=None, head=None)
      -> config.json (the family's class, with the labels of a fine-tuned run),
         model.safetensors, and the tokenizer files of the run's vocabulary
    export_npz(workdir, output, step=None)
      -> one array per parameter, keyed by its path ('encoder_model/encoder/layer_0/...')

The family is the run's `model.family`; the class is `head` (a Head of the family,
encoderx/hf/<family>.py), by default the first of the method's `export_heads` that the
parameters fill. Parts that no class of the family holds (SpanBERT's SBO head) are left
out and named; with an explicit `head`, so is whatever that class has no place for (the
heads, when exporting the bare encoder). Anything else left over stops the export.
"""
from __future__ import annotations

import dataclasses
import io
import os
import shutil
import tempfile

import flax
import numpy as np

from encoderx import errors
from encoderx import files as files_lib
from encoderx import sources
from encoderx.data import fields as data_fields
from encoderx.methods import base as method_lib
from encoderx.methods import registry as method_registry
from encoderx.hf import base, engine, families, tokenizer_files
from encoderx.models import model_config as model_config_lib


class ExportError(errors.UserError, ValueError):
  """A run or an output that cannot be exported; the message says what to do."""


@dataclasses.dataclass
class Exported:
  output: str
  family: str
  hf_class: str
  step: int | None
  files: list[str]
  left_out: list[str]  # model parts with no place in the class

  def summary(self) -> str:
    left = (f"; not exported (no place in {self.hf_class}): {', '.join(self.left_out)}"
            if self.left_out else "")
    return (f"wrote {self.hf_class} ({self.family}) to {self.output}: "
            f"{', '.join(self.files)}{left}")


@dataclasses.dataclass
class Run:
  config: object
  method: method_lib.Method
  model_config: model_config_lib.ModelConfig
  params: dict  # transferable, unscanned numpy arrays, no vocabulary padding rows


def load_run(workdir: str, step: int | None) -> Run:
  workdir = str(files_lib.path(workdir))
  if not files_lib.path(workdir).joinpath("config.json").is_file():
    raise ExportError(f"'{workdir}' is not a run's work directory (it has no "
                      "config.json).", argument="workdir")
  source = os.path.join(workdir, "checkpoints", str(step)) if step is not None else workdir
  try:
    opened = sources.open_source(source)  # a RunSource: the directory has config.json
    params = opened.load_params()
  except sources.InitError as error:
    raise ExportError(str(error), argument="workdir") from None
  method = method_registry.build(opened.config)
  return Run(opened.config, method, method.model_config.replace(layout=dict(scan=False)),
             params)


def output_directory(output: str) -> str:
  directory = files_lib.path(output)
  output = str(directory)
  if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
    raise ExportError(f"'{output}' exists and is not an empty directory; "
                      "name a new one (nothing is overwritten).", argument="output")
  return output


def _publish(staging: str, output: str) -> None:
  """Moves the finished directory into place: a failed export leaves no half of one. An
  object store has no rename of directories: the files are copied there, once whole."""
  if files_lib.is_remote(output):
    files_lib.copy(staging, output)
    return
  if os.path.isdir(output):
    os.rmdir(output)  # empty, checked before
  os.replace(staging, output)


def _choose_head(run: Run, family: str, head: str | None) -> tuple[str, tuple | None]:
  """(head, parts it may leave out: None for any but the encoder's)."""
  fam = families.family_named(family)
  if head is not None:
    if head not in fam.heads:
      raise ExportError(f"family '{family}' has no class for {head!r}; its heads: "
                        f"{', '.join(fam.heads)}.", argument="head")
    return head, None
  held = {engine.part(path) for name in fam.heads
          for _, path, _ in engine.class_rules(run.model_config, family, name)}
  have = {engine.part("/".join(k)) for k in flax.traverse_util.flatten_dict(run.params)}
  unrepresentable = tuple(sorted(have - held))
  fitting = engine.exportable_heads(run.params, run.model_config, family)
  preferred = run.method.export_heads or tuple(fam.heads)
  for name in preferred:
    if name in fitting:
      return name, unrepresentable
  classes = ", ".join(fam.heads[h].hf_class for h in preferred if h in fam.heads)
  raise ExportError(
      f"the run's parameters ({', '.join(sorted(have))}) fill none of the {family} classes "
      f"for the '{run.config.method}' method ({classes or 'none'}); --head=base exports "
      "the encoder alone.")


def _special_token_ids(family: str, directory: str) -> dict:
  """config.json's special-token ids (pad_token_id, ... of those the family's config
  has) as the tokenizer written to `directory` gives them: the run's vocabulary's, not
  the released model's that the config class defaults to (EuroBERT's mask_token_id
  128002 in an 8,000-token vocabulary, which transformers warns of on every load)."""
  import transformers  # pylint: disable=g-import-not-at-top
  tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
  return {name: getattr(tokenizer, name) for name in engine.special_token_fields(family)}


def export_hf(workdir: str, output: str, step: int | None = None,
              head: str | None = None) -> Exported:
  """Writes the run's (step's) parameters as a Hugging Face model directory."""
  output = output_directory(output)
  return write_hf(load_run(workdir, step), output, step, head)


def write_hf(run: Run, output: str, step: int | None, head: str | None,
             config_fields: dict | None = None, add_files=None,
             max_length: int | None = None) -> Exported:
  """export_hf of a loaded run into `output` (checked by output_directory), with
  `config_fields` in config.json, the files `add_files(directory)` writes beside the
  model before the directory is published, and `max_length` as the tokenizer's
  model_max_length (default: the positions the model has)."""
  import torch  # pylint: disable=g-import-not-at-top
  family = run.model_config.family
  fam = families.family_named(family)
  vocab = run.config.data.vocab.to_dict()
  if vocab["kind"] != fam.vocab_kind:
    raise ExportError(f"data.vocab.kind={vocab['kind']!r}: Hugging Face {family} "
                      f"tokenizers ({fam.tokenizer_class}) are {fam.vocab_kind!r}.")
  if fam.vocab_layout and data_fields.vocab_layout(vocab) != fam.vocab_layout:
    raise ExportError(f"data.vocab.layout={data_fields.vocab_layout(vocab)!r}: Hugging Face "
                      f"{family} tokenizers ({fam.tokenizer_class}) have the special "
                      f"tokens of the {fam.vocab_layout!r} layout.")
  if fam.vocab_layout == "deberta" and vocab.get("strip_accents"):
    raise ExportError("data.vocab.strip_accents=True: DebertaV2Tokenizer keeps accents; "
                      "export a run trained with strip_accents=False.")
  try:
    fam.check(run.model_config)
    head, drop = _choose_head(run, family, head)
    state_dict, head, left_out = engine.export_state_dict(run.params, run.model_config,
                                                          family, head, drop)
  except base.ConversionError as error:
    raise ExportError(f"cannot export (model.family={family!r}): {error}") from None
  spec = fam.heads[head]
  fields = run.method.export_fields() if spec.labels else {}
  parent = None if files_lib.is_remote(output) else os.path.dirname(output)
  if parent:
    os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=".export-", dir=parent)  # beside it, if local
  try:
    tokenizer_files.write(vocab, fam.tokenizer_class, staging, max_length or (
        run.model_config.embeddings.max_positions
        - run.model_config.embeddings.position_offset))
    model = engine.hf_model(run.model_config, family, head, **{
        **fields, **(config_fields or {}),
        **_special_token_ids(family, staging)})
    missing, unexpected = model.load_state_dict(
        {name: torch.from_numpy(np.array(value))
         for name, value in state_dict.items()}, strict=False)
    missing = [name for name in missing if name not in spec.tied_names(run.model_config)
               and not engine.is_buffer(name)]
    if missing or unexpected:  # the rules and the class disagree: a bug in the rules
      raise ExportError(f"{spec.hf_class} and the {family} rules disagree: weights not "
                        f"filled {missing}, unknown {unexpected}.")
    model.save_pretrained(staging, safe_serialization=True)
    if add_files:
      add_files(staging)
    files = sorted(os.listdir(staging))
    _publish(staging, output)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return Exported(output, family, spec.hf_class, step, files, left_out)


def export_npz(workdir: str, output: str, step: int | None = None) -> Exported:
  """Writes every transferable parameter of the run (step) as numpy arrays keyed by
  their paths ('encoder_model/embeddings/word_embeddings/embedding', ...), unscanned and
  with `vocab_size` rows (the padding rows of model.vocab_multiple dropped):
  `numpy.load(output)`."""
  output = str(files_lib.path(output))
  if not output.endswith(".npz"):
    raise ExportError(f"'{output}' must end with .npz.", argument="output")
  if files_lib.exists(output):
    raise ExportError(f"'{output}' exists; name a new file (nothing is "
                      "overwritten).", argument="output")
  run = load_run(workdir, step)
  flat = {"/".join(k): np.asarray(v) for k, v in
          flax.traverse_util.flatten_dict(run.params).items()}
  buffer = io.BytesIO()
  np.savez(buffer, **flat)
  files_lib.write_atomically(output, buffer.getvalue())
  return Exported(output, run.model_config.family, "npz", step,
                  [os.path.basename(output)], [])
