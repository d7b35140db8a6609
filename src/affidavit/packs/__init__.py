"""Proof packs: RCE v0.1 export and offline verification (PACK-FORMAT.md)."""
