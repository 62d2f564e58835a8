"""Hard-negative mining as a library (mine/miner.py, mine/rows.py): `mine`,
`MiningOptions`, and the files it reads and writes.

    from encoderx import embed, mine
    pairs = mine.read_pairs("pairs.tsv")
    mined = mine.mine(pairs, embed.Embedder("hf:DIR", normalize=True),
                      mine.MiningOptions(num_negatives=3, absolute_margin=0.05))
    mine.write_rows("pairs-negatives.jsonl", mined)

The command line is `python -m encoderx.mine` (mine/__main__.py).
"""
from encoderx.mine.miner import (OUTPUT_FORMATS, SAMPLING_STRATEGIES, Mined, MiningError,
                                 MiningOptions, max_positives, mine, select_negatives,
                                 summary)
from encoderx.mine.rows import check_output, read_corpus, read_pairs, write_rows

__all__ = ["OUTPUT_FORMATS", "SAMPLING_STRATEGIES", "Mined", "MiningError", "MiningOptions",
           "check_output", "max_positives", "mine", "read_corpus", "read_pairs",
           "select_negatives", "summary", "write_rows"]
