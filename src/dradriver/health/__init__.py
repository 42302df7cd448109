"""Device health: the current state of every published device and what changes it."""

#: The health report `serve` keeps in its state directory, read by `status` and `fake-event`.
HEALTH_FILE = "health.json"
