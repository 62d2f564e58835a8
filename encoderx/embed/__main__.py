"""The embed command: sentence embeddings of a text file (embed/embedder.py).

    python -m encoderx.embed --init_from=RUN|hf:DIR --input=sentences.txt --output=emb.npy \
        [--pooling=mean|cls] [--[no]normalize] [--prompt_name=query] [--batch_size=64] \
        [--max_length=256]

A sentence-transformers directory's pooling, normalization, prompts and length apply
where a flag leaves them open (encoderx/hf/st_directory.py), as an embedding run's
(simcse, contrastive) do; otherwise mean pooling, not normalized, 256 tokens.

writes a float32 [lines, hidden] array, row i the embedding of line i of the input (a
UTF-8 file, one text a line).
"""
from __future__ import annotations

import io

import numpy as np
from absl import flags

from encoderx import cli, embed
from encoderx import files as files_lib

FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  texts = embed.read_lines(FLAGS.input)
  embedder = embed.Embedder(FLAGS.init_from, pooling=FLAGS.pooling,
                            normalize=FLAGS.normalize, max_length=FLAGS.max_length,
                            batch_size=FLAGS.batch_size)
  vectors = embedder(texts, show_progress=True, prompt_name=FLAGS.prompt_name)
  buffer = io.BytesIO()
  np.save(buffer, vectors)
  files_lib.write_atomically(FLAGS.output, buffer.getvalue())
  print(f"wrote {vectors.shape[0]} embeddings of {vectors.shape[1]} dimensions to "
        f"{FLAGS.output}")


def define_flags() -> None:
  flags.DEFINE_string("init_from", None,
                      "a run's work directory, or hf:DIR (a Hugging Face model)")
  flags.DEFINE_string("input", None, "UTF-8 text, one text a line")
  flags.DEFINE_string("output", None, "where to write the .npy array")
  flags.DEFINE_enum("pooling", None, list(embed.POOLINGS), "how a text's token outputs "
                    "become one vector (default: the model's, else mean)")
  flags.DEFINE_bool("normalize", None, "scale to unit length (default: as the model does)")
  flags.DEFINE_string("prompt_name", None, "the model's prompt to put before each text "
                      "(default: its default prompt, if any)")
  flags.DEFINE_integer("batch_size", 64, "texts per batch")
  flags.DEFINE_integer("max_length", None, "tokens per text at most, [CLS] and [SEP] "
                       "included (default: the model's, else 256)")
  flags.mark_flags_as_required(["init_from", "input", "output"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
