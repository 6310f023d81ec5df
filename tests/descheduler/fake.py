"""The in-repo fake API server with what a migration needs of a real one: the pods' ``binding``
subresource and the scheduler's CRDs (:class:`~tests.scheduler.bindingfake.BindingFakeApiServer`),
PodMigrationJobs, and the PodDisruptionBudget-aware Eviction API the base fake implements."""

from __future__ import annotations

from tests.kubefake.server import Kind
from tests.scheduler.bindingfake import BindingFakeApiServer

PMJ = Kind("scheduling.koordinator.sh", "v1alpha1", "podmigrationjobs", "PodMigrationJob", False)


class DeschedulerFakeApiServer(BindingFakeApiServer):
    """See the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.register(PMJ)

    def jobs(self) -> list[dict]:
        return [
            o for (plural, _, _), o in sorted(self.objects.items()) if plural == "podmigrationjobs"
        ]
