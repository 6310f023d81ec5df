"""Node conditions koordinator-py writes (ours; Koordinator has none of these).

``koordinator.sh/BEEvictionPressure`` says that the node's koordlet is evicting BE pods for
memory or CPU, or did so within its cool-down: a scheduler should not send BE pods back there
"into the fire". Written by the koordlet (gate ``BEEvictionCondition``) in ``status.conditions``
of its Node, read by koord-scheduler's ``BEEvictionPressure`` filter, which keeps BE pods off the
node while the condition is ``True`` and leaves every other pod alone (docs/qos-eviction.md says
why a condition and a filter rather than a ``NoSchedule`` taint).
"""

from __future__ import annotations

from apis.extension import DOMAIN_PREFIX

CONDITION_BE_EVICTION_PRESSURE = DOMAIN_PREFIX + "BEEvictionPressure"
"""The condition's ``type`` (a domain-qualified name, so it cannot clash with the kubelet's or
another agent's)."""
REASON_EVICTING_BE_PODS = "EvictingBEPods"
"""``reason`` while the koordlet evicts, or evicted within the cool-down (``status: "True"``)."""
REASON_BE_EVICTION_COOLED_DOWN = "BEEvictionCooledDown"
"""``reason`` once the cool-down passed without an eviction (``status: "False"``)."""
REASON_BE_EVICTION_CONDITION_OFF = "BEEvictionConditionOff"
"""``reason`` when a koordlet whose gate is off finds the condition left ``True`` (a restart with
the gate turned off) and lifts it, so BE pods are not kept away for ever."""
