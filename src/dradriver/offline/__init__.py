"""Offline tools: what the CLI runs without a node or a cluster, never loaded by `serve`.

- `cel`: Kubernetes DRA CEL selectors, evaluated with the scheduler's semantics.
- `allocation`: the scheduler's allocation of claims to published devices, simulated.
- `migrate`: NVIDIA device plugin / DRA driver configurations translated into dradriver's.
- `workloads`: where each workload kind keeps its pod spec (migrate, dry-run and validate read pods).
"""
