"""Walking a traced function's equations, for tests of how a computation is laid out."""
import jax
import jax.extend


def equations(jaxpr):
  """Every equation of `jaxpr` and of the jaxprs inside it (custom VJPs, pjit, loops)."""
  for equation in jaxpr.eqns:
    yield equation
  for sub in jax.extend.core.subjaxprs(jaxpr):
    yield from equations(sub)
