"""Preparing ResourceClaims on the node: allocation handling, opaque config, CDI specs, checkpoint."""
