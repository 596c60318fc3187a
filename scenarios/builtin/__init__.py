"""Built-in scenarios: each a YAML file plus the Python rules it names."""
