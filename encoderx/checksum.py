"""Checksums of what a checkpoint holds, so that a damaged one is found on restore.

orbax checks only part of what it reads (tensorstore's crc32c covers the shard indices,
not the array data), so a checkpoint with flipped bytes may restore into garbage. At save
a checksum of every array and JSON item is stored beside them; restoring recomputes them
and compares.

The checksum of an array is computed where the array is, inside one jit over the global
(sharded) array: every 32-bit word (narrower types widened) is mixed with its flat index
by a bijective integer hash (murmur3's finalizer), and the results are added modulo 2**32
in two lanes with different seeds. Modular addition does not depend on order, so the
value is the same however the array is sharded or however many devices or hosts hold it,
and nothing but two words per array leaves the devices. A change of one word always
changes both sums (the hash is a bijection); other changes go unnoticed with probability
about 2**-64.
"""
from __future__ import annotations

import functools
import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np

_SEEDS = (0x9E3779B9, 0x85EBCA77)


def _mix(h: jax.Array) -> jax.Array:
  """murmur3's 32-bit finalizer: a bijection of uint32 that spreads every bit."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _words(x: jax.Array) -> jax.Array:
  """The array's bits as uint32, one or more words per element ([..., words])."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)[..., None]
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint32}[x.dtype.itemsize]
  bits = jax.lax.bitcast_convert_type(x, unsigned)
  return (bits if x.dtype.itemsize == 8 else bits[..., None]).astype(jnp.uint32)


def _array_checksum(x: jax.Array) -> jax.Array:
  """uint32 [2]: the two lanes' sums for one array."""
  words = _words(jnp.asarray(x))
  index = jnp.zeros(words.shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(words.ndim)):  # the flat index, without reshaping shards
    index = index + jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis) * jnp.uint32(
        stride % 2**32)
    stride *= words.shape[axis]
  return jnp.stack([jnp.sum(_mix(words + _mix(index ^ jnp.uint32(seed))), dtype=jnp.uint32)
                    for seed in _SEEDS])


@functools.cache
def _checksums_fn():
  return jax.jit(lambda leaves: [_array_checksum(x) for x in leaves])


def _path_name(path) -> str:
  """A tree path as 'params/encoder_model/...' (the same for a TrainState and a dict)."""
  parts = []
  for key in path:
    for attribute in ("name", "key", "idx"):
      if hasattr(key, attribute):
        parts.append(str(getattr(key, attribute)))
        break
  return "/".join(parts)


def arrays(tree) -> dict[str, str]:
  """{path: checksum} of every array of `tree` (16 hex digits each)."""
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  sums = _checksums_fn()([leaf for _, leaf in flat])
  # The sums are replicated: every process reads its own copy.
  return {_path_name(path): "".join(f"{int(w):08x}" for w in np.asarray(
              s.addressable_data(0) if isinstance(s, jax.Array) else s))
          for (path, _), s in zip(flat, sums)}


def json_item(value) -> str:
  """The checksum of a JSON item: sha256 of its canonical text (a restored copy, where
  tuples came back as lists, has the same)."""
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode("utf-8")).hexdigest()


def differences(stored: dict[str, str], computed: dict[str, str], prefix: str = ""
                ) -> list[str]:
  """The paths (under `prefix`) whose checksum differs from the stored one or that only
  one side has."""
  wanted = {p: c for p, c in stored.items() if p.startswith(prefix)}
  return sorted(p for p in wanted.keys() | computed.keys() if wanted.get(p) != computed.get(p))
