"""Device health: the current state of every published device and what changes it."""
