"""Device backends, one package per forward type, each imported on first use."""
