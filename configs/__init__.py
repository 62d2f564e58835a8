"""ml_collections configs, one per family and size; installed as `encoderx.configs`."""
