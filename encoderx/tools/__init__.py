"""The measuring tools: what tells how fast and how right encoderx is, not what a run needs.

    python -m encoderx.tools.bench        train-step throughput and MFU against Hugging Face
                                          PyTorch (--json=FILE keeps the figures)
    python -m encoderx.tools.bench_data   the input pipeline at corpus scale
    python -m encoderx.tools.compare      equal-budget training against Hugging Face PyTorch
    python -m encoderx.tools.finetune_compare   the classify and tag recipes beside
                                                transformers.Trainer
    python -m encoderx.tools.sts_compare  STS-B embeddings beside sentence-transformers' own
                                          evaluation, on the same weights
    python -m encoderx.tools.plot         loss curves of runs from their TensorBoard logs
    python -m encoderx.tools.perf_page    docs/performance.md's tables from the bench's JSON

and, as libraries: `parity` (training step parity with Hugging Face PyTorch, for the
tests), `torch_adapters` (the one set of per-method, per-family PyTorch counterparts the
bench, compare and the parity tests share) with `torch_optim` (the same optimizers in
PyTorch), `flops` (model FLOPs of a step, from the config) and `batch_inspector` (a
masked batch, decoded).

The tools sit above everything else: they may import any part of encoderx (and
`encoderx.configs`), and nothing outside encoderx/tools/ imports them. PyTorch and
transformers (the `hf` extra) are needed by the tools that compare with them.
"""
