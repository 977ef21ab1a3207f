"""A run's weight store: the service the trainer publishes through and the generation workers pull from,
and the spec each of them opens it from (infra/weightstore/factory.py `open_store`).

`mooncake`: a Mooncake master on the run's host, started here or taken from the `WarmWorkers` of runs in
sequence (engine/core/warm.py), which keeps it for the next run at `stop`. `ray`: the Ray object store,
its key table a detached actor that `stop` destroys (it would outlive the driver and keep every version
in the object store of a cluster that stays up).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.core.warm import WarmWorkers


class RunWeightStore:
    def __init__(
        self,
        kind: str,
        host: str,
        run_dir: Path,
        namespace: str,
        segment_bytes: int | None,
        warm: WarmWorkers | None,
    ) -> None:
        self.kind, self.host, self.run_dir, self.namespace = kind, host, run_dir, namespace
        self.segment_bytes, self.warm = segment_bytes, warm
        self.spec: dict[str, Any] | None = None
        self._master: Any = None  # infra/weightstore/mooncake_master.py MooncakeMaster

    def start(self) -> dict[str, Any]:
        """Start (or take over) the service; returns the spec the workers open it from. `segment_bytes`:
        what each Mooncake client contributes to the pool (mooncake only)."""
        if self.kind == "mooncake":
            from infra.weightstore.mooncake_master import MooncakeMaster

            log_dir = self.run_dir / "mooncake"
            kept = self.warm.take_master(self.host) if self.warm is not None else None  # the last run's
            self._master = kept or MooncakeMaster(host=self.host, log_dir=log_dir).start()
            self.spec = {
                "kind": "mooncake",
                "master_addr": self._master.master_addr,
                "metadata_url": self._master.metadata_url,
                "segment_bytes": self.segment_bytes,
                "log_dir": str(log_dir),
            }
        else:
            self.spec = {"kind": "ray", "name": f"{self.namespace}-weights", "namespace": self.namespace}
        return dict(self.spec)

    def stop(self) -> None:
        """Stop the service, or leave the master to the WarmWorkers: the retired workers' clients stay
        open for the next run (the trainer's `retire` removed this run's keys)."""
        if self._master is not None:
            if self.warm is not None:
                self.warm.keep_master(self._master)
            else:
                self._master.stop()
            self._master = None
        if self.spec is not None and self.spec["kind"] == "ray":
            from infra.weightstore.ray_store import RayObjectStore

            RayObjectStore(self.spec["name"], self.namespace).destroy()
        self.spec = None
