"""Device mesh and the one table of logical axis rules.

The mesh has three axes: 'data' (pure data parallelism), 'fsdp' (data parallelism
whose parameters and optimizer state are sharded too, ZeRO-3 style) and 'tensor'
(Megatron-style: attention heads, the FFN's inner dimension and the vocabulary split
across devices). Modules name the axes of their parameters and activations
logically; this table says which mesh axes each logical name is split over.
"""
from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import ml_collections
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from encoderx import errors

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
      errors.fail("mesh", f"{described}: the {len(devices)} devices do not divide by "
                      f"the fixed axes' product {known}.",
                      f"Choose sizes whose product divides {len(devices)}.")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    errors.fail("mesh", f"{described} needs {math.prod(shape)} devices; "
                    f"{len(devices)} are available.",
                    f"Choose sizes whose product is {len(devices)}, or set one axis to -1 "
                    "(the devices left).")
  return jax.make_mesh(tuple(shape), MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                       devices=devices)


def config_section() -> ml_collections.ConfigDict:
  """config.mesh: the axes' sizes (their product is the device count; -1 takes what is
  left) and the logical axis rules (logical name -> the mesh axes it is split over,
  "data,fsdp", "tensor", "" to keep it whole; activations' names included), by default
  LOGICAL_AXIS_RULES."""
  mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
  mesh.rules = rules_as_config()
  return mesh


def validate(mesh_config) -> None:
  """Checks config.mesh; raises errors.ConfigError."""
  for axis in MESH_AXES:
    if mesh_config[axis] == 0 or mesh_config[axis] < -1:
      errors.fail(f"mesh.{axis}", f"must be a positive size or -1, got {mesh_config[axis]}.")
  if sum(mesh_config[axis] == -1 for axis in MESH_AXES) > 1:
    errors.fail("mesh", "at most one axis may be -1.")
  check_rules(mesh_config.rules)


def rules_as_config(rules=LOGICAL_AXIS_RULES):
  """The rules as config.mesh.rules: logical name -> "mesh,axes" ("" = replicated)."""
  def axes(value):
    return value if isinstance(value, str) else ",".join(value or ())
  return ml_collections.ConfigDict({name: axes(value) for name, value in rules})


def rules_from_config(rules_config):
  """config.mesh.rules -> the ((logical name, mesh axes), ...) tuple flax reads."""
  def axes(value):
    names = tuple(a.strip() for a in value.split(",") if a.strip())
    return names[0] if len(names) == 1 else (names or None)
  return tuple((name, axes(rules_config[name])) for name in rules_config.keys())


def check_rules(rules_config) -> None:
  """ConfigError naming config.mesh.rules.<name> for a mesh axis that does not exist."""
  for name in rules_config.keys():
    value = rules_config[name]
    if not isinstance(value, str):
      errors.fail(f"mesh.rules.{name}", f"{value!r} is not a string of mesh axes.",
                      'Write e.g. "data,fsdp", "tensor" or "" (replicated).')
    for axis in (a.strip() for a in value.split(",") if a.strip()):
      if axis not in MESH_AXES:
        errors.fail(f"mesh.rules.{name}",
                        f"{axis!r} is not a mesh axis ({', '.join(MESH_AXES)}).")


def _fit(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh, path=(), unsplit=None
         ) -> PartitionSpec:
  """Drops mesh axes from dimensions they do not divide (those stay replicated),
  noting each such dimension in `unsplit` so that it can be reported."""
  fitted = []
  for index, (dim, axes) in enumerate(
      zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = math.prod(mesh.shape[name] for name in names)
    fitted.append(axes if names and dim % size == 0 else None)
    if names and dim % size and unsplit is not None:
      unsplit.append(Unsplit(jax.tree_util.keystr(path), index, dim, names, size))
  return PartitionSpec(*fitted)


@dataclasses.dataclass(frozen=True)
class Unsplit:
  """A dimension its rule would split but whose size the mesh axes do not divide."""
  path: str
  dimension: int
  size: int
  axes: tuple[str, ...]
  axes_size: int

  def __str__(self):
    return (f"{self.path}: dimension {self.dimension} ({self.size}) does not divide over "
            f"mesh axes {','.join(self.axes)} ({self.axes_size}); it is kept whole on "
            "every device")


def logical_to_shardings(logical_specs, abstract_tree, mesh: Mesh,
                         rules=LOGICAL_AXIS_RULES):
  """Logical PartitionSpecs (a pytree) -> (NamedShardings fitted to the array shapes,
  the list of dimensions left whole because their mesh axes do not divide them)."""
  mesh_specs = nn.logical_to_mesh(logical_specs, rules)
  unsplit = []
  shardings = jax.tree_util.tree_map_with_path(
      lambda path, spec, leaf: NamedSharding(
          mesh, _fit(spec, tuple(leaf.shape), mesh, path, unsplit)),
      mesh_specs, abstract_tree, is_leaf=lambda x: isinstance(x, PartitionSpec))
  return shardings, unsplit


def data_parallel_size(mesh: Mesh) -> int:
  """How many ways a batch is split: the product of the data-parallel axes."""
  return math.prod(mesh.shape[axis] for axis in BATCH_AXES)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batches are split over the data-parallel axes on their first dimension."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())
