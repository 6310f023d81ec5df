"""The resource executor: the only way the koordlet changes a cgroup.

:class:`~koordlet.executor.writer.CgroupWriter` takes the knob objects of the knob table
(``koordlet.system.knobs``: ``write(CPU_SHARES, rel_dir, 512)``, type-checked), validates every
value against it, resolves the file through the cgroup layout, skips writes that would
change nothing and performs the rest on its single ``cgroup-writer`` thread. QoS strategies
and runtime hooks submit to it; none of them opens a cgroup file for writing.
"""

from koordlet.executor.audit import AuditEntry, AuditLog
from koordlet.executor.batch import BatchResult, BatchWrite
from koordlet.executor.writer import CgroupWriter, WriteResult

__all__ = ["AuditEntry", "AuditLog", "BatchResult", "BatchWrite", "CgroupWriter", "WriteResult"]
