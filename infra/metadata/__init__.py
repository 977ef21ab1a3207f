"""Shared metadata store (SQLAlchemy): pools, bindings, steps, checkpoints, how runs ended."""

from infra.metadata.store import BindingRow, MetadataStore, PoolsExhausted

__all__ = ["BindingRow", "MetadataStore", "PoolsExhausted"]
