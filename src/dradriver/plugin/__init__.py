"""The kubelet-facing side of the driver: registration, the DRA gRPC services and their sockets."""
