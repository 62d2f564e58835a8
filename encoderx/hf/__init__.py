"""Hugging Face (PyTorch) conversion, used by both import (`--init_from=hf:DIR`,
encoderx/sources.py) and export (encoderx/export/).

    base.py             what a family's table is made of: Transform, Rule, Head, Family,
                        ConversionError
    rules.py            the building blocks the families' tables share
    families.py         the families by name (`model.family`), loaded lazily
    <family>.py         one module per family, each defining `FAMILY = Family(...)`
                        (bert, roberta, albert, deberta, electra, xlnet, modernbert,
                        eurobert)
    engine.py           both directions from a family's table, and its transformers config
    directory.py        reading a Hugging Face model directory (config, vocabulary, weights)
    tokenizer_files.py  writing a run's vocabulary as a Hugging Face tokenizer's files

A family plugs in with a module `encoderx/hf/<family>.py` that defines `FAMILY` and a
line in families.py (or `families.register(name, module_path)` from outside).
"""
