"""The mine command: hard negatives for (anchor, positive) pairs, as sentence-transformers'
mine_hard_negatives mines them (mine/miner.py).

    python -m encoderx.mine --init_from=RUN|hf:DIR --input=pairs.tsv \
        --output=triplets.jsonl [--corpus=corpus.jsonl] [--num_negatives=3] \
        [--range_min=0] [--range_max=N] [--absolute_margin=M | --relative_margin=R] \
        [--max_score=S] [--min_score=S] [--sampling_strategy=top|random] [--seed=0] \
        [--output_format=triplet|n-tuple|labeled-pair|labeled-list] [--overwrite] \
        [--query_prompt_name=NAME | --query_prompt=TEXT] \
        [--corpus_prompt_name=NAME | --corpus_prompt=TEXT]

Bad options, columns or outputs stop in one line before the model is loaded; a prompt
name the model lacks, once it is loaded, before anything is embedded or written. Without
prompt flags, anchors get the model's `query` prompt and candidates its `document` prompt
where it has them (never its default prompt), as sentence-transformers' mining does.
"""
from __future__ import annotations

from absl import flags

from encoderx import cli, embed, mine

FLAGS = flags.FLAGS


def main(argv) -> None:
  del argv
  options = mine.MiningOptions(
      range_min=FLAGS.range_min, range_max=FLAGS.range_max, max_score=FLAGS.max_score,
      min_score=FLAGS.min_score, absolute_margin=FLAGS.absolute_margin,
      relative_margin=FLAGS.relative_margin, num_negatives=FLAGS.num_negatives,
      sampling_strategy=FLAGS.sampling_strategy, include_positives=FLAGS.include_positives,
      output_format=FLAGS.output_format, seed=FLAGS.seed,
      query_prompt=FLAGS.query_prompt, query_prompt_name=FLAGS.query_prompt_name,
      corpus_prompt=FLAGS.corpus_prompt, corpus_prompt_name=FLAGS.corpus_prompt_name)
  mine.check_output(FLAGS.output, FLAGS.overwrite, options)
  pairs = mine.read_pairs(FLAGS.input, FLAGS.anchor_column, FLAGS.positive_column)
  corpus = mine.read_corpus(FLAGS.corpus, FLAGS.corpus_column) if FLAGS.corpus else None
  options.checked_range_max(mine.max_positives([anchor for anchor, _ in pairs]))
  embedder = embed.Embedder(FLAGS.init_from, pooling=FLAGS.pooling, normalize=True,
                            max_length=FLAGS.max_length, batch_size=FLAGS.batch_size)
  mined = mine.mine(pairs, embedder, options, corpus, FLAGS.anchor_column,
                    FLAGS.positive_column, show_progress=True)
  mine.write_rows(FLAGS.output, mined)
  print(mine.summary(mined, options))
  print(f"wrote {len(mined.rows)} rows to {FLAGS.output}")


def define_flags() -> None:
  flags.DEFINE_string("init_from", None,
                      "a run's work directory, or hf:DIR (a Hugging Face model)")
  flags.DEFINE_string("input", None, "(anchor, positive) rows: .tsv, .csv or .jsonl")
  flags.DEFINE_string("anchor_column", "anchor", "the input's anchor column")
  flags.DEFINE_string("positive_column", "positive", "the input's positive column")
  flags.DEFINE_string("corpus", None, "candidate negatives (.tsv, .csv or .jsonl) besides "
                      "the positives; default: the positives alone")
  flags.DEFINE_string("corpus_column", "text", "the corpus file's text column")
  flags.DEFINE_string("output", None, "where to write the rows: .tsv, .csv or .jsonl")
  flags.DEFINE_bool("overwrite", False, "replace an existing output")
  flags.DEFINE_integer("num_negatives", 3, "negatives per anchor")
  flags.DEFINE_integer("range_min", 0, "skip this many of the nearest candidates")
  flags.DEFINE_integer("range_max", None, "consider this many of the nearest candidates "
                       "(default: range_min + num_negatives (x10 with a margin or "
                       "max_score) + the most positives of an anchor)")
  flags.DEFINE_float("absolute_margin", None, "skip candidates scored above the "
                     "positive's score minus this")
  flags.DEFINE_float("relative_margin", None, "skip candidates scored above the "
                     "positive's score minus this fraction of its magnitude, in [0, 1)")
  flags.DEFINE_float("max_score", None, "skip candidates scored above this")
  flags.DEFINE_float("min_score", None, "skip candidates scored below this")
  flags.DEFINE_enum("sampling_strategy", "top", list(mine.SAMPLING_STRATEGIES),
                    "the best candidates left, or a random draw of them")
  flags.DEFINE_integer("seed", 0, "of the random draws")
  flags.DEFINE_bool("include_positives", False, "keep the positives among the candidates "
                    "(reranking evaluation sets; n-tuple output)")
  flags.DEFINE_enum("output_format", "triplet", list(mine.OUTPUT_FORMATS),
                    "triplet: a row a negative; n-tuple: negative_1..k in one row; "
                    "labeled-pair / labeled-list: texts with 1/0 labels")
  flags.DEFINE_string("query_prompt", None, "put before each anchor as it is embedded, "
                      "instead of a prompt of the model's ('' for none)")
  flags.DEFINE_string("query_prompt_name", None, "the model's prompt to put before each "
                      "anchor (default: its 'query' prompt, if any)")
  flags.DEFINE_string("corpus_prompt", None, "put before each candidate as it is embedded, "
                      "instead of a prompt of the model's ('' for none)")
  flags.DEFINE_string("corpus_prompt_name", None, "the model's prompt to put before each "
                      "candidate (default: its 'document' prompt, if any)")
  flags.DEFINE_enum("pooling", None, list(embed.POOLINGS), "how a text's token outputs "
                    "become one vector (default: the model's, else mean)")
  flags.DEFINE_integer("batch_size", 64, "texts per batch")
  flags.DEFINE_integer("max_length", None, "tokens per text at most, [CLS] and [SEP] "
                       "included (default: the model's, else 256)")
  flags.mark_flags_as_required(["init_from", "input", "output"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
