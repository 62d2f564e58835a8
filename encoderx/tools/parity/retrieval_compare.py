"""Retrieval on STS-B's pairs, two ways on the same weights: encoderx's command, and
sentence-transformers' embeddings and search scored by the same metric library.

    python -m encoderx.tools.parity.retrieval_compare --init_from=hf:MODEL_DIR \
        --data=../shared/corpora/stsb/dev.tsv --output=runs/stsb-retrieval [--max_length=256]

The set (written to --output in BEIR's layout, so that `python -m encoderx.retrieval
--data=runs/stsb-retrieval` scores it too): each distinct second sentence of the file a
document, each distinct first sentence with a pair scored 4 or more a query, those pairs
its relevant documents (relevance 1). The file is a TSV with columns score, text_a,
text_b.

encoderx: `retrieval.evaluate` (embed.Embedder, mean pooling and normalization as the
model's sentence-transformers modules; faiss' exact search; pytrec_eval's scores).
sentence-transformers: `SentenceTransformer(MODEL_DIR).encode(normalize_embeddings=True)`
and `util.semantic_search` (its exact cosine search) for the top k, scored by the same
pytrec_eval wrapper (encoderx/evaluation/retrieval.py); and its own
`InformationRetrievalEvaluator` (its own nDCG, recall and MRR) as a third line.
"""
from __future__ import annotations

import json
import os

from absl import app, flags

from encoderx import embed, retrieval
from encoderx.data import beir, labelled
from encoderx.evaluation import retrieval as retrieval_scores

FLAGS = flags.FLAGS
RELEVANT = 4.0  # an STS-B score this high or higher: the second sentence answers the first


def write_stsb_set(path: str, directory: str, threshold: float = RELEVANT) -> beir.Collection:
  """The retrieval set of an STS-B TSV (see the module docstring), written to `directory`
  in BEIR's layout and read back."""
  rows = [row for _, row in labelled.read_rows(path, ["score", "text_a", "text_b"])]
  docs = {text: f"d{i}" for i, text in enumerate(dict.fromkeys(r["text_b"] for r in rows))}
  firsts = dict.fromkeys(r["text_a"] for r in rows if float(r["score"]) >= threshold)
  queries = {text: f"q{i}" for i, text in enumerate(firsts)}
  judged = dict.fromkeys((queries[r["text_a"]], docs[r["text_b"]]) for r in rows
                         if float(r["score"]) >= threshold)
  os.makedirs(os.path.join(directory, beir.QRELS), exist_ok=True)
  def write(name, lines):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as handle:
      handle.writelines(line + "\n" for line in lines)
  write(beir.CORPUS, (json.dumps({"_id": i, "title": "", "text": t}) for t, i in docs.items()))
  write(beir.QUERIES, (json.dumps({"_id": i, "text": t}) for t, i in queries.items()))
  write(os.path.join(beir.QRELS, "test.tsv"),
        ["\t".join(beir.QRELS_COLUMNS)] + [f"{q}\t{d}\t1" for q, d in judged])
  return beir.read_directory(directory)


def sentence_transformers_run(model, collection: beir.Collection,
                              k: int) -> dict[str, dict[str, float]]:
  """{query id: {doc id: cosine}}: a SentenceTransformer's normalized embeddings and
  exact search (util.semantic_search)."""
  from sentence_transformers import util  # pylint: disable=g-import-not-at-top
  query_ids, doc_ids = list(collection.queries), list(collection.corpus)
  encode = lambda texts: model.encode(texts, normalize_embeddings=True, convert_to_tensor=True)
  hits = util.semantic_search(encode([collection.queries[q] for q in query_ids]),
                              encode([collection.corpus[d] for d in doc_ids]), top_k=k)
  return {query: {doc_ids[hit["corpus_id"]]: float(hit["score"]) for hit in found}
          for query, found in zip(query_ids, hits)}


def main(argv) -> None:
  del argv
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  from sentence_transformers.evaluation import InformationRetrievalEvaluator  # pylint: disable=g-import-not-at-top
  collection = write_stsb_set(FLAGS.data, FLAGS.output)
  embedder = embed.Embedder(FLAGS.init_from, pooling="mean", normalize=True,
                            max_length=FLAGS.max_length)
  ours_run = retrieval.rank(embedder, collection, FLAGS.k)
  model = SentenceTransformer(FLAGS.init_from.removeprefix("hf:"), device="cpu")
  model.max_seq_length = FLAGS.max_length
  theirs_run = sentence_transformers_run(model, collection, FLAGS.k)
  relevant = {query: {doc for doc, score in judged.items() if score > 0}
              for query, judged in collection.qrels.items()}
  own = InformationRetrievalEvaluator(
      collection.queries, collection.corpus, relevant, mrr_at_k=[10], ndcg_at_k=[10],
      accuracy_at_k=[1], precision_recall_at_k=[100], map_at_k=[10], name="stsb",
      write_csv=False)(model)
  names = ("ndcg@10", "recall@100", "mrr@10")
  ours, theirs = (retrieval_scores.scores(collection.qrels, run)
                  for run in (ours_run, theirs_run))
  line = lambda measures: ", ".join(f"{name} {measures[name]:.4f}" for name in names)
  print(f"{len(collection.queries)} queries, {len(collection.corpus)} documents, "
        f"{sum(map(len, relevant.values()))} relevant pairs "
        f"(score >= {RELEVANT:g}) of {FLAGS.data}; written to {FLAGS.output}")
  print(f"encoderx retrieval (embed + faiss + pytrec_eval): {line(ours)}")
  print(f"sentence-transformers encode + semantic_search + pytrec_eval: {line(theirs)}")
  print("sentence-transformers InformationRetrievalEvaluator: " + line(
      {name: own[f"stsb_cosine_{name}"] for name in names}))
  print("differences (encoderx - sentence-transformers, same metrics): " + ", ".join(
      f"{name} {ours[name] - theirs[name]:+.1e}" for name in names))
  top_ours, top_theirs = (retrieval_scores.top(run, 10) for run in (ours_run, theirs_run))
  shared = sum(len(set(top_ours[q]) & set(top_theirs[q])) for q in collection.queries)
  largest = max(abs(score - theirs_run[q][d]) for q, docs in ours_run.items()
                for d, score in docs.items() if d in theirs_run[q])
  print(f"top-10 documents in common: {shared} of {10 * len(collection.queries)}; largest "
        f"cosine difference on a document both retrieved: {largest:.1e}")


if __name__ == "__main__":
  flags.DEFINE_string("init_from", None, "hf:DIR, a sentence-transformers model directory.")
  flags.DEFINE_string("data", None, "A TSV of pairs: score, text_a, text_b (STS-B).")
  flags.DEFINE_string("output", None, "Where to write the retrieval set (BEIR's layout).")
  flags.DEFINE_integer("k", 100, "Documents retrieved per query.")
  flags.DEFINE_integer("max_length", 256, "Tokens per text at most, on both sides "
                       "(all-MiniLM-L6-v2's max_seq_length).")
  flags.mark_flags_as_required(["init_from", "data", "output"])
  app.run(main)
