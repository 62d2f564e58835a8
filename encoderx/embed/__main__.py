"""The embed command: sentence embeddings of a text file (embed/embedder.py).

    python -m encoderx.embed --init_from=hf:DIR --input=sentences.txt --output=emb.npy \
        [--pooling=mean|cls] [--normalize] [--batch_size=64] [--max_length=256]

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
  vectors = embedder(texts, show_progress=True)
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
  flags.DEFINE_enum("pooling", "mean", list(embed.POOLINGS), "how a text's token outputs "
                    "become one vector")
  flags.DEFINE_bool("normalize", False, "scale to unit length")
  flags.DEFINE_integer("batch_size", 64, "texts per batch")
  flags.DEFINE_integer("max_length", 256, "tokens per text at most, [CLS] and [SEP] "
                       "included")
  flags.mark_flags_as_required(["init_from", "input", "output"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
