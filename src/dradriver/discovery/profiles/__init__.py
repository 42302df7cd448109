"""Built-in fake GPU profiles (`--fake-gpus NAME`) and the MIG profile tables they use (package data)."""
