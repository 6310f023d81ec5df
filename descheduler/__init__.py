"""koord-descheduler: moves pods off hot nodes, each move made safe by a PodMigrationJob.

The framework (``framework.py``: profiles, the Deschedule and Balance plugin table, the evictor),
LowNodeLoad (``loadaware/``), the MigrationController with its arbitration (``migration/``), and
two front ends: ``koord-descheduler explain`` over a snapshot and ``koord-descheduler run``
against a cluster under leader election. See docs/descheduler.md.
"""
