"""Who uses which GPU, and how much: per-device and per-claim telemetry on /metrics.

`model` says what a reading is and who holds each device (pure), `exposition` turns readings into
metric families (pure), `idle` finds claims whose devices stay idle (pure); `sampler` reads the
devices on a timer through a backend's `TelemetryReader` (`nvml`, `fake`) and serves the latest
readings to scrapes.
"""
