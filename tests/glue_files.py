"""A miniature GLUE directory in GLUE's own layout (tests and the docs' figures):
SST-2 from the shared rotten_tomatoes corpus, STS-B from the shared stsb corpus (both
as GLUE's download script lays them out), and small hand-written files for the other six
tasks' layouts (CoLA without a header, MRPC's quality and ID columns, QQP's ids, MNLI's
many columns and two dev sets, QNLI, RTE).

    python tests/glue_files.py OUT_DIR [TRAIN_ROWS DEV_ROWS]   # (0 0: the whole corpora)
"""
import pathlib
import sys

SHARED = pathlib.Path(__file__).resolve().parent.parent.parent / "shared" / "corpora"
ROTTEN_TOMATOES, STSB = SHARED / "rotten_tomatoes", SHARED / "stsb"

SENTENCES = ["The cat sat on the mat.", "Anne walked to Bath in the rain.",
             "He is very tall.", "Emma laughed at the letter.", "They was happy.",
             "The garden is green and quiet.", "Nobody came to the ball.",
             "She reads every book she finds."]


def shared_rows(path: pathlib.Path, rows: int, offset: int = 0) -> list[list[str]]:
  """The fields of a shared corpus TSV's rows (after its header), `rows` of them from
  `offset` (0: all)."""
  lines = path.read_text(encoding="utf-8").splitlines()[1:]
  lines = lines[offset:offset + rows] if rows else lines[offset:]
  return [line.split("\t") for line in lines]


def _write(path: pathlib.Path, header: list[str] | None, rows: list[list[str]]) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  lines = ([["\t".join(header)]] if header else []) + [["\t".join(row)] for row in rows]
  path.write_text("".join(line[0] + "\n" for line in lines), encoding="utf-8")


def _pairs(count: int, shift: int):
  """(sentence, other sentence, index) triples from SENTENCES."""
  return [(SENTENCES[i % 8], SENTENCES[(i + shift) % 8], i) for i in range(count)]


def write_glue(root: pathlib.Path, train_rows: int = 64, dev_rows: int = 32) -> pathlib.Path:
  """Writes the miniature GLUE under `root` (root/SST-2/train.tsv, ...); returns root."""
  for split, rows, name in (("train", train_rows, "train.tsv"), ("dev", dev_rows, "dev.tsv")):
    sst = shared_rows(ROTTEN_TOMATOES / name, rows)
    _write(root / "SST-2" / f"{split}.tsv", ["sentence", "label"],
           [[text, label] for label, text in sst])
    sts = shared_rows(STSB / name, rows)
    _write(root / "STS-B" / f"{split}.tsv",
           ["index", "genre", "filename", "year", "old_index", "source1", "source2",
            "sentence1", "sentence2", "score"],
           [[str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", a, b,
             score] for i, (score, a, b) in enumerate(sts)])
  for split, count in (("train", 24), ("dev", 12)):
    _write(root / "CoLA" / f"{split}.tsv", None,
           [["gj04", str(int(i % 5 != 4)), "" if i % 5 != 4 else "*", SENTENCES[i % 8]]
            for i in range(count)])
    _write(root / "MRPC" / f"{split}.tsv",
           ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
           [[str(i % 2), str(1000 + i), str(2000 + i), a, b] for a, b, i in _pairs(count, 1)])
    _write(root / "QQP" / f"{split}.tsv",
           ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
           [[str(i), str(2 * i), str(2 * i + 1), a.replace(".", "?"), b.replace(".", "?"),
             str(int(i % 3 == 0))] for a, b, i in _pairs(count, 2)])
    _write(root / "QNLI" / f"{split}.tsv", ["index", "question", "sentence", "label"],
           [[str(i), a.replace(".", "?"), b, ("entailment", "not_entailment")[i % 2]]
            for a, b, i in _pairs(count, 3)])
    _write(root / "RTE" / f"{split}.tsv", ["index", "sentence1", "sentence2", "label"],
           [[str(i), a, b, ("not_entailment", "entailment")[i % 2]]
            for a, b, i in _pairs(count, 4)])
  mnli = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
          "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1",
          "sentence2"]
  gold = ("entailment", "neutral", "contradiction")
  _write(root / "MNLI" / "train.tsv", mnli + ["label1", "gold_label"],
         [[str(i), "1", f"{i}e", "fiction", "( a )", "( b )", "(ROOT a)", "(ROOT b)", a, b,
           gold[i % 3], gold[i % 3]] for a, b, i in _pairs(30, 5)])
  for name, genre, shift in (("dev_matched", "fiction", 6), ("dev_mismatched", "letters", 7)):
    _write(root / "MNLI" / f"{name}.tsv",
           mnli + [f"label{k}" for k in range(1, 6)] + ["gold_label"],
           [[str(i), "1", f"{i}e", genre, "( a )", "( b )", "(ROOT a)", "(ROOT b)", a, b,
             *[gold[i % 3]] * 5, gold[i % 3]] for a, b, i in _pairs(9, shift)])
  return root


if __name__ == "__main__":
  rows = [int(a) for a in sys.argv[2:4]] + [64, 32][len(sys.argv[2:4]):]
  print(write_glue(pathlib.Path(sys.argv[1]), *rows))
