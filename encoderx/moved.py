"""What moved in the house's rebuilds (docs/migration.md), in one table: config fields,
modules and config files, each old name -> its new one.

Its readers: config.py (`migrate_fields` reads an older run's config.json and its
checkpoints' descriptions with the fields at their new place; a user writing an old field
is refused with one line naming the new one), cli.py (an old config file's path) and
`MovedModules` below (importing or running an old module: `python -m encoderx.bench`,
`from encoderx import method`), which encoderx/__init__.py installs. A leaf: imports
nothing of encoderx.
"""
from __future__ import annotations

import importlib.abc

# Kind of name -> {old: new}. A block of entries that moved together sits under a comment.
MOVED = {
    # Config fields: dotted paths; a group's path moves every field under it.
    "field": {
        # The fields only one fine-tuning method reads, out of `finetune` (issue 34).
        **{f"finetune.{name}": f"qa.{name}"
           for name in ("version_2", "null_score_threshold", "doc_stride", "max_query_length",
                        "max_answer_length", "n_best_size")},
        "finetune.tag_column": "tag.column",
        "finetune.simcse": "simcse.kind",
        "finetune.hard_negative_column": "simcse.hard_negative_column",
        "finetune.temperature": "simcse.temperature",
        # Fine-tuning's batching, out of `data` (the corpus and what every method reads).
        "data.length_buckets": "finetune.length_buckets",
        "data.group_by_length": "finetune.group_by_length",
        # The model's flat fields, grouped by concern (encoderx/models/model_config.py).
        # model.attention, model.norm and model.feed_forward became groups of the same name:
        # an older run's leaf value moves into the group.
        "model.attention": "model.attention.variant",
        "model.attention_kernel": "model.attention.kernel",
        "model.attention_dropout": "model.attention.dropout",
        "model.attention_bias": "model.attention.bias",
        "model.num_kv_heads": "model.attention.num_kv_heads",
        "model.local_attention": "model.attention.window",
        "model.global_attention_every": "model.attention.global_every",
        "model.relative_attention_terms": "model.attention.relative_terms",
        "model.position_buckets": "model.attention.position_buckets",
        "model.max_relative_positions": "model.attention.max_relative_positions",
        "model.share_att_key": "model.attention.share_att_key",
        "model.clamp_len": "model.attention.clamp_len",
        "model.embedding_size": "model.embeddings.size",
        "model.position_embedding": "model.embeddings.position",
        "model.max_position_embeddings": "model.embeddings.max_positions",
        "model.position_offset": "model.embeddings.position_offset",
        "model.type_vocab_size": "model.embeddings.type_vocab_size",
        "model.embedding_layer_norm": "model.embeddings.layer_norm",
        "model.rope_theta": "model.embeddings.rope_theta",
        "model.local_rope_theta": "model.embeddings.local_rope_theta",
        "model.feed_forward": "model.feed_forward.kind",
        "model.mlp_bias": "model.feed_forward.bias",
        "model.norm": "model.norm.kind",
        "model.norm_position": "model.norm.position",
        "model.layer_norm_eps": "model.norm.eps",
        "model.norm_bias": "model.norm.bias",
        "model.first_attention_norm": "model.norm.first_attention",
        "model.layer_sharing": "model.layout.sharing",
        "model.scan_layers": "model.layout.scan",
        "model.remat": "model.layout.remat",
        "model.initializer": "model.init.scheme",
        "model.initializer_range": "model.init.range",
        "model.initializer_cutoff": "model.init.cutoff",
        "model.pooler_act": "model.heads.pooler_act",
        "model.classifier_pooling": "model.heads.pooling",
        "model.pooler_norm": "model.heads.pooler_norm",
        "model.token_head_transform": "model.heads.token_transform",
        "model.decoder_bias": "model.heads.decoder_bias",
        "model.classifier_bias": "model.heads.classifier_bias",
        "model.tie_word_embeddings": "model.heads.tie_word_embeddings",
        "model.mlm_transform": "model.heads.mlm_transform",
        "model.enhanced_mask_decoder": "model.heads.enhanced_mask_decoder",
    },
    # Modules: importing or running the old one stops naming where its contents live.
    "module": {
        "encoderx.bench": "encoderx.tools.speed.bench",
        "encoderx.bench_data": "encoderx.tools.data.bench_data",
        "encoderx.compare": "encoderx.tools.quality.pretrain_compare",
        "encoderx.plot": "encoderx.tools.figures.plot",
        "encoderx.parity": "encoderx.tools.parity.step_parity",
        "encoderx.flops": "encoderx.tools.speed.flops",
        "encoderx.batch_inspector": "encoderx.tools.data.batch_inspector",
        "encoderx.method": "encoderx.methods.base and encoderx.methods.registry",
        "encoderx.export.hf": "encoderx.hf (engine, rules, families, one module per family)",
        "encoderx.export.hf_directory": "encoderx.hf.directory",
        "encoderx.export.tokenizer_files": "encoderx.hf.tokenizer_files",
        # The measuring tools, one package for what each measures (docs/design.md).
        "encoderx.tools.accelerator": "encoderx.tools.speed.accelerator",
        "encoderx.tools.batch_inspector": "encoderx.tools.data.batch_inspector",
        "encoderx.tools.bench": "encoderx.tools.speed.bench",
        "encoderx.tools.bench_data": "encoderx.tools.data.bench_data",
        "encoderx.tools.bench_models": "encoderx.tools.speed.bench_models",
        "encoderx.tools.compare": "encoderx.tools.quality.pretrain_compare",
        "encoderx.tools.costs": "encoderx.tools.speed.costs",
        "encoderx.tools.finetune_compare": "encoderx.tools.quality.finetune_compare",
        "encoderx.tools.finetune_padding": "encoderx.tools.data.finetune_padding",
        "encoderx.tools.finetune_steps": "encoderx.tools.speed.finetune_steps",
        "encoderx.tools.flops": "encoderx.tools.speed.flops",
        "encoderx.tools.long_context": "encoderx.tools.speed.long_context",
        "encoderx.tools.padding": "encoderx.tools.data.padding",
        "encoderx.tools.perf_page": "encoderx.tools.figures.perf_page",
        "encoderx.tools.plot": "encoderx.tools.figures.plot",
        "encoderx.tools.report": "encoderx.tools.figures.report",
        "encoderx.tools.retrieval_compare": "encoderx.tools.parity.retrieval_compare",
        "encoderx.tools.sts_compare": "encoderx.tools.parity.sts_compare",
        "encoderx.tools.timing": "encoderx.tools.speed.timing",
        "encoderx.tools.torch_adapters": "encoderx.tools.parity.torch_adapters",
        "encoderx.tools.torch_optim": "encoderx.tools.parity.torch_optim",
        "encoderx.tools.train_steps": "encoderx.tools.speed.train_steps",
        # Names that say their one job (issue 43).
        "encoderx.trainer": "encoderx.train.trainer",
        "encoderx.data.stream": "encoderx.data.shard_stream",
        "encoderx.data.streams": "encoderx.data.row_streams",
        "encoderx.data.preprocessors": "encoderx.data.example_builders",
        "encoderx.data.preprocessed": "encoderx.data.example_files",
    },
    # Config files (before one file per family, configs/<family>.py:<variant>): paths
    # relative to the repository, matched at the end of the path given.
    "config": {
        **{f"configs/{family}_{size}.py": f"configs/{family}.py:{size}"
           for family, sizes in (("bert", ("tiny", "base", "large")),
                                 ("roberta", ("tiny", "base")), ("albert", ("tiny", "base")),
                                 ("spanbert", ("tiny", "base")),
                                 ("electra", ("tiny", "small", "base")),
                                 ("deberta", ("tiny", "base")),
                                 ("xlnet", ("tiny", "base", "large")))
           for size in sizes},
        "configs/deberta_v3_tiny.py": "configs/deberta.py:v3_tiny",
        "configs/deberta_v3_base.py": "configs/deberta.py:v3_base",
        **{f"configs/finetune_{task}.py": f"configs/finetune.py:{task}"
           for task in ("classify", "similarity", "tag", "qa", "simcse")},
    },
}


class MovedModules(importlib.abc.MetaPathFinder):
  """Answers the old module names with a ModuleNotFoundError that names the new one."""

  def find_spec(self, fullname, path, target=None):
    del path, target
    modules = MOVED["module"]
    if fullname in modules:
      # No `name=`: `from encoderx import method` would turn an error naming the missing
      # module itself into a bare "cannot import name".
      raise ModuleNotFoundError(f"{fullname} is now {modules[fullname]} (see "
                                "docs/migration.md)")
    return None
