"""Training methods, one module each: the interface in methods/base.py, the registry that
loads them by name (config.method) in methods/registry.py."""
