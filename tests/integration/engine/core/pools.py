"""A ResourceManager over pools, with a local Ray cluster that has those pools as resources."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ray

from engine.config import PoolConfig
from engine.core.resources import ResourceManager
from infra.local_ray import init_local_ray
from infra.metadata import MetadataStore

ROOT = Path(__file__).resolve().parents[4]


@contextmanager
def pools_on_ray(
    pools: list[PoolConfig], db: Path, run: str, **ray_kwargs: object
) -> Iterator[ResourceManager]:
    """`ray.init` with the pools' resources (and e.g. `num_gpus`); shut down and closed afterwards."""
    store = MetadataStore(f"sqlite:///{db}")
    manager = ResourceManager(pools, store, run=run)
    init_local_ray(
        num_cpus=2,
        resources=manager.ray_resources,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        **ray_kwargs,
    )
    try:
        yield manager
    finally:
        ray.shutdown()
        store.close()
