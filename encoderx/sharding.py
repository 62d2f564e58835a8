"""Device mesh and the one table of logical axis rules.

The mesh has three axes: 'data' (pure data parallelism), 'fsdp' (data parallelism
whose parameters and optimizer state are sharded too, ZeRO-3 style) and 'tensor'
(Megatron-style: attention heads, the FFN's inner dimension and the vocabulary split
across devices). Modules name the axes of their parameters and activations
logically; this table says which mesh axes each logical name is split over.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from encoderx import config as config_lib

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

LOGICAL_AXIS_RULES = (
    # activations
    ("activation_batch", BATCH_AXES),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_mlp", "tensor"),
    ("activation_heads", "tensor"),
    ("activation_vocab", "tensor"),
    # parameters
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("positions", None),
    ("layers", None),
)


def make_mesh(mesh_config, devices=None) -> Mesh:
  """A (data, fsdp, tensor) mesh; one axis of the config may be -1 (the rest). A shape
  that does not fit the devices is a ConfigError naming config.mesh."""
  devices = list(devices if devices is not None else jax.devices())
  shape = [mesh_config[axis] for axis in MESH_AXES]
  known = math.prod(s for s in shape if s != -1)
  described = " x ".join(f"{axis}={size}" for axis, size in zip(MESH_AXES, shape))
  if -1 in shape:
    if len(devices) % known:
      config_lib.fail("mesh", f"{described}: the {len(devices)} devices do not divide by "
                      f"the fixed axes' product {known}.",
                      f"Choose sizes whose product divides {len(devices)}.")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    config_lib.fail("mesh", f"{described} needs {math.prod(shape)} devices; "
                    f"{len(devices)} are available.",
                    f"Choose sizes whose product is {len(devices)}, or set one axis to -1 "
                    "(the devices left).")
  return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                       devices=devices)


def _fit(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
  """Drops mesh axes from dimensions they do not divide (those stay replicated)."""
  fitted = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = math.prod(mesh.shape[name] for name in names)
    fitted.append(axes if names and dim % size == 0 else None)
  return PartitionSpec(*fitted)


def logical_to_shardings(logical_specs, abstract_tree, mesh: Mesh):
  """Logical PartitionSpecs (a pytree) -> NamedShardings fitted to the array shapes."""
  mesh_specs = nn.logical_to_mesh(logical_specs, LOGICAL_AXIS_RULES)
  return jax.tree_util.tree_map(
      lambda spec, leaf: NamedSharding(mesh, _fit(spec, tuple(leaf.shape), mesh)),
      mesh_specs, abstract_tree, is_leaf=lambda x: isinstance(x, PartitionSpec))


def data_parallel_size(mesh: Mesh) -> int:
  """How many ways a batch is split: the product of the data-parallel axes."""
  return math.prod(mesh.shape[axis] for axis in BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batches are split over the data-parallel axes on their first dimension."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())
