"""The measuring tools: what tells how fast and how right encoderx is, not what a run needs.

One package for each thing measured (docs/design.md#the-measuring-tools names every module):

    speed/     how fast: the bench (`python -m encoderx.tools.speed.bench`), its train steps,
               costs, FLOPs and timing, long context, the GPU bench on recorded batches
    parity/    the same numbers as the reference implementations on the same weights and
               inputs: Hugging Face PyTorch step for step, sentence-transformers' STS-B and
               retrieval scores; the PyTorch counterparts the other tools share
    quality/   encoderx against Hugging Face at an equal budget: pretraining
               (`pretrain_compare`) and fine-tuning (`finetune_compare`)
    data/      what the input pipeline makes and how fast: bench_data, padding, a batch
    figures/   how measurements are shown: report's tables and records, docs/performance.md,
               loss curves

The tools sit above everything else: they may import any part of encoderx (and
`encoderx.configs`), and nothing outside encoderx/tools/ (but launch/'s entries) imports
them. PyTorch and transformers (the `hf` extra) are needed by the tools that compare with
them.
"""
