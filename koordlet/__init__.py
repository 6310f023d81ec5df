"""koordlet: Koordinator's node agent, in Python.

Components (one folder each): ``system`` (synchronous host access), ``executor`` (the single
cgroup writer), ``metriccache`` (embedded time series), ``statesinformer`` (workload
inventory), ``collectors``, ``qos`` and ``server``; ``daemon`` is the only module that knows them
all.
"""

__version__ = "0.1.0"
