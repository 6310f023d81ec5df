"""Runtime hooks: the koordlet's say in a pod's cgroups as the runtime creates them.

One framework (:mod:`.model`, :mod:`.table`, :mod:`.framework`) serves every mode: the hook
server koord-runtime-proxy calls (:mod:`.hookserver`), the NRI plugin (:mod:`.nri`) and, later,
the reconciler. See docs/runtimehooks.md.
"""
