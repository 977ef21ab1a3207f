"""Weight stores: a key -> bytes interface (`base`) with Mooncake, Ray object store and in-memory backends.

Backends are imported from their own modules (`infra.weightstore.mooncake`, `.ray_store`) so that this
package needs neither mooncake nor ray installed.
"""

from infra.weightstore.base import (
    Buffer,
    InMemoryStore,
    MissingKeyError,
    StoreFullError,
    WeightStore,
    WeightStoreError,
)

__all__ = ["Buffer", "InMemoryStore", "MissingKeyError", "StoreFullError", "WeightStore", "WeightStoreError"]
