"""Where a run's roles run: pools of hardware (GPU kinds, CPU cores, serverless slots) and their roles."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from engine.config.base import Strict, repeated

PoolKind = Literal["gpu-compute", "gpu-bandwidth", "cpu", "serverless"]
GPU_KINDS = ("gpu-compute", "gpu-bandwidth")  # pools whose workers Ray gives GPUs, where it has them


class PoolConfig(Strict):
    name: str
    kind: PoolKind
    capacity: int = Field(1, ge=0, description="units (GPUs, CPU slots, serverless concurrency)")
    device: str | None = Field(None, description="device profile for modelled backends, e.g. H800")
    cores: list[Annotated[int, Field(ge=0)]] | None = Field(
        None,
        description="CPU cores (Linux ids) the pool's workers run on, and their torch threads by default: "
        "roles in pools with different cores never share one (a CPU machine split as GPU pools are)",
    )

    @field_validator("cores")
    @classmethod
    def _distinct_cores(cls, cores: list[int] | None) -> list[int] | None:
        if cores is not None and (not cores or len(set(cores)) != len(cores)):
            raise ValueError(f"cores must list distinct core ids, at least one; got {cores}")
        return cores


GPU_ROLES = ("actor_train", "actor_gen")  # the roles Ray places on GPUs (engine/core/cluster.py)


class RoleConfig(Strict):
    count: int = Field(1, ge=0)
    pool: str = Field(description="preferred pool name")
    units: int = Field(1, ge=1, description="pool units per worker")
    gpus: float | None = Field(
        None,
        gt=0,
        description="GPUs each worker asks Ray for where the cluster has GPUs; None = one per unit of its "
        "gpu-* pool. A fraction colocates: roles whose fractions sum to at most 1 share one GPU "
        "(e.g. trainer and generation at 0.5 each, in a pool with a unit for each)",
    )

    @field_validator("gpus")
    @classmethod
    def _whole_above_one(cls, gpus: float | None) -> float | None:
        if gpus is not None and gpus > 1 and not gpus.is_integer():
            raise ValueError(f"gpus above 1 must be whole (Ray shares a GPU only below 1); got {gpus}")
        return gpus

    threads: int = Field(
        0,
        ge=0,
        description="CPU threads of each worker's torch compute; 0 = every core in the sync modes (roles "
        "take turns), half of them in the others (training and generation run at once)",
    )


Role = Literal["actor_train", "actor_gen", "reward", "environment"]


def _default_roles() -> dict[Role, RoleConfig]:
    return {
        "actor_train": RoleConfig(pool="compute"),
        "actor_gen": RoleConfig(pool="bandwidth"),
        "reward": RoleConfig(pool="cpu"),
        "environment": RoleConfig(pool="cpu"),
    }


class ResourcesConfig(Strict):
    pools: list[PoolConfig] = Field(
        default_factory=lambda: [
            PoolConfig(name="compute", kind="gpu-compute", capacity=1),
            PoolConfig(name="bandwidth", kind="gpu-bandwidth", capacity=1),
            PoolConfig(name="cpu", kind="cpu", capacity=8),
            PoolConfig(name="serverless", kind="serverless", capacity=4),
        ]
    )
    roles: dict[Role, RoleConfig] = Field(
        default_factory=_default_roles,
        description="where each role's workers run; `environment` (the env loops, scheduler and sample "
        "buffer: one worker) defaults to the first cpu pool when not given",
    )

    @model_validator(mode="after")
    def _roles_name_pools(self) -> ResourcesConfig:
        names = [p.name for p in self.pools]
        if dupes := repeated(names):
            raise ValueError(f"duplicate pool names: {', '.join(dupes)}")
        if "environment" not in self.roles:
            cpu = next((p.name for p in self.pools if p.kind == "cpu"), None)
            if cpu is None:
                raise ValueError("roles.environment: not given, and there is no cpu pool to run it on")
            self.roles["environment"] = RoleConfig(pool=cpu)
        if self.roles["environment"].count != 1:
            raise ValueError(
                f"roles.environment.count: the env loops of a run are one worker (got "
                f"{self.roles['environment'].count})"
            )
        for role, rc in self.roles.items():
            if rc.pool not in names:
                raise ValueError(f"roles.{role}.pool: unknown pool '{rc.pool}'; pools: {', '.join(names)}")
            kind = next(p.kind for p in self.pools if p.name == rc.pool)
            if rc.gpus is not None and (role not in GPU_ROLES or kind not in GPU_KINDS):
                raise ValueError(
                    f"roles.{role}.gpus: only {' and '.join(GPU_ROLES)} in a gpu-* pool take GPUs "
                    f"(pool '{rc.pool}' is {kind})"
                )
        return self


class NetworkConfig(Strict):
    """Where the services of a run that other machines reach listen: the Mooncake master and its metadata
    server, Ray Serve's HTTP proxy (the judge endpoints). Loopback by default; on a multi-machine cluster the
    driver machine's address on a private interface (the README says how each service is guarded)."""

    host: str = Field(
        "127.0.0.1",
        description="an IP address of the driver's machine (not 0.0.0.0), or auto: the driver's node address "
        "as Ray knows it (a pod's IP on Kubernetes)",
    )

    @field_validator("host")
    @classmethod
    def _an_address(cls, host: str) -> str:
        if host == "auto":
            return host
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"host must be an IP address of this machine, got {host!r}") from None
        if address.is_unspecified:
            raise ValueError(f"host {host}: name the interface's own address, not every interface")
        return host
